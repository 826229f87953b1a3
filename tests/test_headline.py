"""The summarisation headline is re-scored from its committed outputs: the file names rows that exist and agree with
it, the writer refuses rows whose share would mislead, and an edited output is caught."""

import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks.quality import headline, study_report
from benchmarks.quality.score import quality

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = [["The cat sat on the mat all day ."], ["Rain is expected across the north tomorrow ."],
              ["Shares rose after the bank cut its rates ."]]
PREDICTIONS = ["A cat sat on a mat .", "Rain is expected tomorrow in the north .", "The bank cut rates ."]


@pytest.fixture
def at_root(monkeypatch):
    """Run from the repository root, where the scripts' relative paths (results, study.env, data) resolve."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def rows(at_root, tmp_path, monkeypatch):
    """``add(name, precision, ...)``: a scored test-split row of a ``cnndm`` study under ``tmp_path``, its outputs,
    scores (by score.py's metrics) and training record, as study.sh leaves them."""
    monkeypatch.setattr(study_report, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(study_report, "RUNS", tmp_path / "runs")
    folder = tmp_path / "results" / "cnndm" / "study"
    folder.mkdir(parents=True)
    test_data = study_report.study_env("cnndm")["TEST_DATA"]

    def add(name: str, precision: str = "bf16-mixed", speedup: float = 2.0, block_repeated_ngrams: int = 0) -> Path:
        outputs = folder / f"{name}.test.outputs.jsonl"
        outputs.write_text("".join(json.dumps({"prediction": p}) + "\n" for p in PREDICTIONS))
        scores = {"data": test_data, "ideal_speedup_over_generated_tokens": speedup,
                  "decode_schedule": {"family": "dense" if speedup == 1.0 else "ranked"},
                  "sampling": {**headline.GREEDY, "block_repeated_ngrams": block_repeated_ngrams},
                  **quality(PREDICTIONS, REFERENCES)}
        (folder / f"{name}.test.json").write_text(json.dumps(scores))
        (folder / f"{study_report.trained_run(name)}.train.json").write_text(json.dumps({"precision": precision}))
        return outputs

    return add


def test_the_committed_headline_names_existing_rows_and_what_they_record(at_root):
    committed = json.loads((ROOT / "benchmarks/results/summarisation_headline.json").read_text())
    assert set(committed) == set(headline.DATASETS)
    for study, entry in committed.items():
        assert all(Path(path).is_file() for path in entry["skip"] + entry["dense"])
        names = {side: [headline.name_of(path) for path in entry[side]] for side in ("skip", "dense")}
        # the speedup, precision and decoding are what the rows' own scores and training records give
        assert headline.headline_entry(study, names["skip"], names["dense"]) == entry


def test_the_committed_headline_rescores_to_its_committed_scores(at_root, shared_data, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["headline"])  # the study's CLI parser would read pytest's arguments
    headline.main([])
    printed = capsys.readouterr().out
    committed = json.loads((ROOT / "benchmarks/results/summarisation_headline.json").read_text())
    for study, entry in committed.items():
        means = {side: sum(json.loads(headline.scores_of(Path(path)).read_text())["rouge_l"] for path in paths)
                 / len(paths) for side, paths in entry.items() if side in ("skip", "dense")}
        assert f"{study}: test ROUGE-L re-scored" in printed
        share = re.search(rf"^{study}:.*?share of the dense ceiling: ([\d.]+)%", printed, re.S | re.M)[1]
        assert share == f"{100 * means['skip'] / means['dense']:.1f}"


def test_the_writer_reads_the_speedup_from_the_scores_and_writes_the_entry(rows, tmp_path):
    rows("flat2x+lora_all_r64", speedup=1.97)
    rows("flat2x+lora_all_r64_s1", speedup=1.99)
    rows("dense+lora_all_r64", speedup=1.0)
    rows("dense+lora_all_r64_s1", speedup=1.0)
    headline.main(["--set", "cnndm", "--skip", "flat2x+lora_all_r64", "flat2x+lora_all_r64_s1",
                   "--dense", "dense+lora_all_r64", "dense+lora_all_r64_s1"])
    written = json.loads((tmp_path / "results" / "summarisation_headline.json").read_text())["cnndm"]
    assert written["speedup"] == 1.98
    assert written["precision"] == "bf16-mixed" and written["decoding"] == "greedy"
    assert [headline.name_of(path) for path in written["skip"]] == ["flat2x+lora_all_r64", "flat2x+lora_all_r64_s1"]
    # a speedup typed over the one the rows give is refused before anything is re-scored
    with pytest.raises(SystemExit, match=r"cnndm's speedup is 2.0, but its rows give 1.98"):
        headline.check("cnndm", {**written, "speedup": 2.0})


@pytest.mark.parametrize(("dense_precision", "dense_blocking", "refusal"), [
    ("32-true", 0, r"different or unrecorded precisions .*'dense\+lora_all_r64_s1': '32-true'"),
    ("bf16-mixed", 3, r"decode differently .*'dense\+lora_all_r64@dense\+no_repeat3': 'no_repeat3'"),
])
def test_the_writer_refuses_rows_of_another_precision_or_decoding(rows, dense_precision, dense_blocking, refusal):
    rows("flat2x+lora_all_r64")
    rows("flat2x+lora_all_r64_s1")
    dense = ["dense+lora_all_r64", "dense+lora_all_r64_s1"]
    if dense_blocking:
        dense = [f"{name}@dense+no_repeat3" for name in dense]
    rows(dense[0], speedup=1.0, block_repeated_ngrams=dense_blocking)
    rows(dense[1], precision=dense_precision, speedup=1.0, block_repeated_ngrams=dense_blocking)
    with pytest.raises(SystemExit, match=refusal):
        headline.main(["--set", "cnndm", "--skip", "flat2x+lora_all_r64", "flat2x+lora_all_r64_s1", "--dense", *dense])


def test_the_writer_refuses_a_missing_row_one_seed_and_a_skipping_ceiling(rows):
    for name in ("flat2x+lora_all_r64", "flat2x+lora_all_r64_s1", "dense+lora_all_r64"):
        rows(name, speedup=1.0 if name.startswith("dense") else 2.0)
    rows("dense+lora_all_r64_s1@flat2x")
    skip = ["flat2x+lora_all_r64", "flat2x+lora_all_r64_s1"]
    with pytest.raises(SystemExit, match=r"'dense\+lora_all_r64_s1' has no test scores: .*outputs.jsonl is missing"):
        headline.headline_entry("cnndm", skip, ["dense+lora_all_r64", "dense+lora_all_r64_s1"])
    with pytest.raises(SystemExit, match="two or more distinct seeds of one configuration"):
        headline.headline_entry("cnndm", skip, ["dense+lora_all_r64"])
    with pytest.raises(SystemExit, match="two or more distinct seeds of one configuration"):
        headline.headline_entry("cnndm", ["flat2x+lora_all_r64", "flat2x+lora_all_r64"], ["dense+lora_all_r64"])
    rows("dense+lora_all_r64@flat2x")
    with pytest.raises(SystemExit, match="the dense rows must decode at full depth"):
        headline.headline_entry("cnndm", skip, ["dense+lora_all_r64@flat2x", "dense+lora_all_r64_s1@flat2x"])


def test_an_edited_or_short_output_is_caught_by_its_rescore(rows):
    outputs = rows("flat2x+lora_all_r64")
    assert headline.rescore(outputs, REFERENCES)["rouge_l"] == quality(PREDICTIONS, REFERENCES)["rouge_l"]
    lines = outputs.read_text().splitlines()
    outputs.write_text("\n".join([lines[0], json.dumps({"prediction": "Shares fell ."}), lines[2]]) + "\n")
    with pytest.raises(SystemExit, match=r"re-scored rouge_l .* differs from the committed"):
        headline.rescore(outputs, REFERENCES)
    outputs.write_text("\n".join(lines[:2]) + "\n")
    with pytest.raises(SystemExit, match="2 outputs for the test split's 3 rows"):
        headline.rescore(outputs, REFERENCES)


def test_absent_references_are_one_line_not_a_traceback(at_root, tmp_path, monkeypatch):
    monkeypatch.setattr(study_report, "STUDIES", tmp_path)
    (tmp_path / "xsum").mkdir()
    (tmp_path / "xsum" / "study.env").write_text(
        f"TRAIN_BASE=benchmarks/quality/xsum/train_base.yaml\nTEST_DATA={tmp_path}/data/test.jsonl\n"
        f'PREPARE="python benchmarks/quality/split_rows.py {tmp_path}/absent.jsonl {tmp_path}/data --rows 1000 '
        'test=800:1000"\n')
    with pytest.raises(SystemExit, match=r"references are absent: .*test.jsonl is missing and the study's PREPARE "
                                         r"could not write it \(.*absent.jsonl"):
        headline.split_references("xsum")
    (tmp_path / "xsum" / "study.env").write_text(f"TRAIN_BASE=x.yaml\nTEST_DATA={tmp_path}/test.csv\n")
    with pytest.raises(SystemExit, match=r"references are absent: .*test.csv is missing$"):
        headline.split_references("xsum")
