"""benchmarks/quality/choose.py: dev's choice of the summarisation headline follows the rule queue.sh set before the
rows were scored."""

from __future__ import annotations

import json

import pytest

from benchmarks.quality import choose as ch
from benchmarks.quality import study_report

PLAIN1, PLAIN2 = "flat2x+lora_all_r64+fp32+accumulate2", "flat2x+lora_all_r64+fp32+accumulate2+two_epochs"
JOINT = "flat2x+lora_all_r64+fp32+accumulate4+two_epochs+joint"
DENSE1, DENSE2 = "dense+lora_all_r64+fp32+accumulate2", "dense+lora_all_r64+fp32+accumulate2+two_epochs"


def no_interval(skip: str, dense: str) -> tuple[float, float]:
    raise AssertionError(f"no paired interval is needed for {skip} against {dense}")


def verdicts(rows: list[ch.Row], interval=no_interval) -> dict[str, ch.Verdict]:
    return {v.row.name: v for v in ch.choose(rows, interval)}


def test_a_skip_row_never_meets_a_ceiling_trained_longer_than_itself():
    rows = [ch.Row(DENSE1, 0.22, 2.0), ch.Row(DENSE2, 0.24, 2.1), ch.Row(PLAIN1, 0.21, 3.0), ch.Row(PLAIN2, 0.22, 2.9)]
    chosen = verdicts(rows)
    assert chosen[PLAIN1].ceiling.name == DENSE1  # the better two-epoch dense row is out of its reach
    assert chosen[PLAIN2].ceiling.name == DENSE2
    # and a ceiling weakened by more training is not the one a longer row meets
    weakened = verdicts([ch.Row(DENSE1, 0.24, 2.0), ch.Row(DENSE2, 0.20, 2.5), ch.Row(PLAIN2, 0.21, 2.9)])
    assert weakened[PLAIN2].ceiling.name == DENSE1 and weakened[PLAIN2].share == pytest.approx(0.21 / 0.24)


def test_the_headline_is_the_highest_dev_share_and_a_tie_goes_to_the_shorter_row():
    rows = [ch.Row(DENSE1, 0.20, 2.0), ch.Row(DENSE2, 0.24, 2.1), ch.Row(PLAIN1, 0.19, 3.0), ch.Row(PLAIN2, 0.22, 2.9)]
    assert ch.choose(rows, no_interval)[0].row.name == PLAIN1  # 95% of 0.20 beats 92% of 0.24
    assert ch.report("cnndm", ch.choose(rows, no_interval)).endswith(f"Headline: {PLAIN1} against {DENSE1}, dev share "
                                                                     "95.0%")
    tie = [ch.Row(DENSE1, 0.20, 2.0), ch.Row(DENSE2, 0.20, 2.1), ch.Row(PLAIN1, 0.19, 3.0), ch.Row(PLAIN2, 0.19, 2.9)]
    assert ch.choose(tie, no_interval)[0].row.name == PLAIN1


@pytest.mark.parametrize(("rouge_l", "loss", "interval", "kept"), [
    (0.23, 2.8, None, True),  # higher ROUGE-L and lower cross entropy: it replaces the plain row
    (0.21, 3.0, None, False),  # lower on both
    (0.23, 3.0, (0.97, 1.12), False),  # they disagree and the interval holds 100%: fewer levers stay
    (0.23, 3.0, (1.01, 1.12), True),  # they disagree and the interval lies above 100%
    (0.21, 2.8, (0.90, 0.99), False),
])
def test_a_lever_row_replaces_the_plain_row_of_its_length_only_by_the_rule(rouge_l, loss, interval, kept):
    asked = []

    def paired(skip: str, dense: str) -> tuple[float, float]:
        asked.append((skip, dense))
        return interval

    rows = [ch.Row(DENSE2, 0.24, 2.1), ch.Row(PLAIN2, 0.22, 2.9), ch.Row(JOINT, rouge_l, loss)]
    chosen = verdicts(rows, paired if interval else no_interval)
    assert asked == ([(JOINT, PLAIN2)] if interval else [])
    assert chosen[JOINT].kept is kept and chosen[PLAIN2].kept is not kept
    assert ch.choose(rows, paired)[0].row.name == (JOINT if kept else PLAIN2)


def test_a_lever_row_without_its_plain_partner_is_refused_in_one_line():
    with pytest.raises(SystemExit, match=r"needs exactly one plain flat2x row of 2 epoch\(s\) scored on dev, found "
                                         r"none"):
        ch.choose([ch.Row(DENSE1, 0.24, 2.0), ch.Row(PLAIN1, 0.22, 2.9), ch.Row(JOINT, 0.23, 2.8)], no_interval)


def test_the_candidates_are_whole_seed_0_float32_runs_decoded_as_trained(tmp_path, monkeypatch):
    """From the files study.sh writes: scores (NAME.dev.json) and training records (NAME.train.json)."""
    monkeypatch.setattr(study_report, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(study_report, "RUNS", tmp_path / "runs")
    folder = tmp_path / "results" / "cnndm" / "study"
    folder.mkdir(parents=True)
    rows = {DENSE1: 0.24, PLAIN1: 0.22, JOINT: 0.23, f"{PLAIN1}_s1": 0.2, f"{DENSE1}@flat2x": 0.1,
            "flat2x+lora_all_r64": 0.18, "flat2x+lora_all_r64+fp32+accumulate2+five_epochs+epoch3": 0.21,
            "calibrated2x+lora_all_r64+fp32": 0.2}
    for name, rouge_l in rows.items():
        (folder / f"{name}.dev.json").write_text(json.dumps({"rouge_l": rouge_l}))
        (folder / f"{name}.train.json").write_text(json.dumps({"val_loss_schedule": 3.0 - rouge_l}))
    assert {r.name: (r.rouge_l, r.loss) for r in ch.candidates("cnndm")} == {
        DENSE1: (0.24, 2.76), PLAIN1: (0.22, 2.78), JOINT: (0.23, 2.77)}
    (folder / f"{PLAIN1}.train.json").write_text(json.dumps({"val_loss_schedule": None}))
    with pytest.raises(SystemExit, match="recorded no dev cross entropy"):
        ch.candidates("cnndm")


def test_a_study_without_skip_candidates_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(study_report, "RESULTS", tmp_path)
    with pytest.raises(SystemExit, match="cnndm: no candidate skip row is scored on dev yet"):
        ch.main(["cnndm"])
    with pytest.raises(SystemExit):
        ch.main(["nosuch"])
    assert "study 'nosuch' has no " in capsys.readouterr().err  # its study.env
