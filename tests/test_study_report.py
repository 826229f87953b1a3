"""The study's tables take no share across precisions and pool seeds only within one, from what each run recorded."""

import json
import os
import shutil
import sys

import pytest

from benchmarks.quality import curve, study_report
from benchmarks.quality.trained_on import record_attempt, resolved_precision
from skiptrain.modeling.precision import cpu_bf16_feature

MACHINE = {"cpu": "a CPU", "cores": 2}


@pytest.fixture
def results(tmp_path, monkeypatch):
    """``add(name, test_bleu, precision, attempts=1, splits=("test", "devmatch"))``: a run of an ``e2e`` study under
    ``tmp_path`` scored ``test_bleu`` (and as much ROUGE-L) on ``splits``, and recorded as trained in ``attempts``
    attempts (a stopped run resumes in a new one)."""
    monkeypatch.setattr(study_report, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(study_report, "RUNS", tmp_path / "runs")
    folder = tmp_path / "results" / "e2e" / "study"
    folder.mkdir(parents=True)

    def add(name: str, test_bleu: float, precision: str, attempts: int = 1,
            splits: tuple[str, ...] = ("test", "devmatch")) -> None:
        score = {"bleu": test_bleu, "rouge_l": test_bleu, "ideal_speedup_over_generated_tokens": 1.0}
        for split in splits:
            (folder / f"{name}.{split}.json").write_text(json.dumps(score))
        trained = {"wall_seconds": 600, "steps": 10, "val_loss_schedule": 1.0, "val_loss_dense": 1.0,
                   "precision": precision, "machines": [MACHINE] * attempts}
        (folder / f"{name}.train.json").write_text(json.dumps(trained))

    return add


@pytest.fixture
def table(capsys, monkeypatch):
    """``table(module, *args)``: the rows of the first markdown table ``module``'s main prints, as cells."""

    def run(module, *args) -> list[list[str]]:
        monkeypatch.setattr(sys, "argv", [module.__name__, *args])
        capsys.readouterr()
        module.main()
        lines = capsys.readouterr().out.split("\n\n")[0].splitlines()
        return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]

    return run


def test_the_pairs_curve_divides_each_precision_by_its_own_ceiling_and_never_pools_across_them(results, table,
                                                                                              tmp_path):
    results("dense+lora_all_r64+train4k", 0.60, "bf16-mixed")
    results("dense+lora_all_r64+train4k_s1", 0.62, "bf16-mixed")
    results("flat2x+lora_all_r64+train4k", 0.58, "bf16-mixed")
    # the same command on a CPU without native bf16 trains its second seed in float32: a row of its own
    results("flat2x+lora_all_r64+train4k_s1", 0.40, "32-true")
    results("dense+lora_all_r64+train4k+fp32", 0.50, "32-true")
    results("flat2x+lora_all_r64+train4k+fp32", 0.45, "32-true")
    results("dense+lora_all_r64", 0.50, "bf16-mixed")  # the study base's 2,000 pairs
    results("flat2x+lora_all_r64", 0.45, "bf16-mixed")
    results("flat2x+lora_all_r64+train4k+two_epochs", 0.70, "bf16-mixed")  # another lever, at one size: no curve
    rows = {(row[0], row[1], row[2]): row for row in table(curve, "e2e", "--axis", "pairs")}
    assert set(rows) == {("2000", "bf16-mixed", "dense+lora_all_r64"), ("2000", "bf16-mixed", "flat2x+lora_all_r64"),
                         ("4000", "bf16-mixed", "dense+lora_all_r64"), ("4000", "bf16-mixed", "flat2x+lora_all_r64"),
                         ("4000", "32-true", "dense+lora_all_r64"), ("4000", "32-true", "flat2x+lora_all_r64")}
    assert curve.read_curve("e2e", curve.AXES["pairs"]).left_out == ["flat2x+lora_all_r64+two_epochs"]
    assert rows["2000", "bf16-mixed", "flat2x+lora_all_r64"][5] == "90%"
    bf16, fp32 = rows["4000", "bf16-mixed", "flat2x+lora_all_r64"], rows["4000", "32-true", "flat2x+lora_all_r64"]
    assert (bf16[3], bf16[4], bf16[5]) == ("1/1", "58.0", "95%")  # of the bf16 ceiling's mean, 61
    assert (fp32[3], fp32[4], fp32[5]) == ("2/2", "42.5", "85%")  # 40 and 45 pooled, of the fp32 ceiling's 50
    plot = tmp_path / "curve.png"
    assert table(curve, "e2e", "--axis", "pairs", "--plot", str(plot)) == list(rows.values())
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_the_study_table_gives_no_share_to_a_row_of_another_precision(results, table):
    results("dense+lora_all_r64", 0.60, "bf16-mixed")
    results("flat2x+lora_all_r64", 0.54, "bf16-mixed")
    results("flat2x+lora_all_r64+fp32", 0.57, "32-true")
    rows = {row[0]: row for row in table(study_report, "e2e", "--ceiling", "dense+lora_all_r64")}
    assert rows["flat2x+lora_all_r64"][1:2] + rows["flat2x+lora_all_r64"][6:7] == ["bf16-mixed", "90%"]
    assert rows["flat2x+lora_all_r64+fp32"][1:2] + rows["flat2x+lora_all_r64+fp32"][6:7] == ["32-true", "-"]


def stopped_and_resumed_run(run, stopped_for: int, last_attempt: int) -> None:
    """A run directory as study.sh leaves it when its first attempt was stopped ``stopped_for`` seconds after fit
    started (its last checkpoint) and the second, resumed from there, finished in ``last_attempt`` seconds."""
    for version, steps in ((0, range(0, 5)), (1, range(5, 10))):
        folder = run / "lightning_logs" / f"version_{version}"
        (folder / "checkpoints").mkdir(parents=True)
        (folder / "config.yaml").write_text("seed_everything: 0\n")
        (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
        rows = [f"{step},,\n" for step in steps] + [f"{steps[-1]},1.2,1.3\n"]
        (folder / "metrics.csv").write_text("step,val/loss_skip,val/loss_dense\n" + "".join(rows))
    started = (run / "lightning_logs/version_0/config.yaml").stat().st_mtime
    os.utime(run / "lightning_logs/version_0/checkpoints/last.ckpt", (started + stopped_for,) * 2)
    (run / "wall_seconds").write_text(f"{last_attempt}\n")
    (run / "trained_on.json").write_text(json.dumps({"precision": "32-true", "machines": [MACHINE] * 2}))


def test_a_resumed_runs_train_minutes_add_up_its_attempts(results, table, tmp_path):
    results("dense+lora_all_r64+train8k", 0.60, "32-true")
    results("dense+lora_all_r64+train8k_s1", 0.60, "32-true")
    results("flat2x+lora_all_r64+train8k", 0.58, "32-true")
    results("dense+lora_all_r64", 0.50, "32-true")  # the curve's other size
    results("flat2x+lora_all_r64", 0.45, "32-true")
    stopped_and_resumed_run(tmp_path / "runs/e2e/dense+lora_all_r64+train8k", stopped_for=300, last_attempt=1500)
    summary = study_report.training_summary("e2e", "dense+lora_all_r64+train8k")
    assert (summary["attempt_seconds"], summary["steps"], summary["val_loss_schedule"]) == ([300, 1500], 10, 1.2)
    rows = {row[0]: row for row in table(study_report, "e2e", "--ceiling", "dense+lora_all_r64+train8k", "--record")}
    assert rows["dense+lora_all_r64+train8k"][-1] == "30 (2 attempts)"
    assert rows["dense+lora_all_r64+train8k_s1"][-1] == rows["flat2x+lora_all_r64+train8k"][-1] == "10"
    points = {row[2]: row for row in table(curve, "e2e", "--axis", "pairs") if row[0] == "8000"}
    assert points["dense+lora_all_r64"][-1] == "20 (1 resumed)"  # the mean of 30 and 10 minutes
    assert points["flat2x+lora_all_r64"][-1] == "10"
    # the record keeps the attempts, so the committed results rebuild the same table without the run directory
    shutil.rmtree(tmp_path / "runs")
    assert {row[0]: row for row in table(study_report, "e2e", "--ceiling", "dense+lora_all_r64+train8k")} == rows


def test_a_run_whose_time_was_lost_keeps_its_share_and_reads_as_untimed(results, table, tmp_path):
    results("dense+lora_all_r64+train8k", 0.60, "32-true")
    results("flat2x+lora_all_r64+train8k", 0.57, "32-true")
    results("flat2x+lora_all_r64+train8k_s1", 0.63, "32-true")
    results("dense+lora_all_r64", 0.50, "32-true")  # the curve's other size
    results("flat2x+lora_all_r64", 0.45, "32-true")
    # recorded afterwards, without its run directory: the precision its lever fixes, no time and no losses
    lost = {"wall_seconds": None, "steps": 10, "val_loss_schedule": None, "val_loss_dense": None,
            "precision": "32-true"}
    (tmp_path / "results/e2e/study/flat2x+lora_all_r64+train8k_s1.train.json").write_text(json.dumps(lost))
    rows = {row[0]: row for row in table(study_report, "e2e", "--ceiling", "dense+lora_all_r64+train8k")}
    assert rows["flat2x+lora_all_r64+train8k_s1"][6] == "105%"
    assert rows["flat2x+lora_all_r64+train8k_s1"][-2:] == ["-", "-"]
    points = {row[2]: row for row in table(curve, "e2e", "--axis", "pairs") if row[0] == "8000"}
    assert points["flat2x+lora_all_r64"][3:6] == ["2/2", "60.0", "100%"]
    assert points["flat2x+lora_all_r64"][-1] == "10 (1 untimed)"  # the mean of the seeds that kept their time


def test_a_run_records_its_training_beside_its_scores_as_it_finishes(results, table, tmp_path, monkeypatch):
    """What study.sh runs after training: the record outlives the run directory, so a sitting that loses runs/ after
    scoring still leaves the row's time, losses and precision."""
    results("dense+lora_all_r64+train8k", 0.60, "32-true")
    stopped_and_resumed_run(tmp_path / "runs/e2e/flat2x+lora_all_r64+train8k", stopped_for=300, last_attempt=1500)
    monkeypatch.setattr(sys, "argv", ["study_report", "e2e", "--record-run", "flat2x+lora_all_r64+train8k"])
    study_report.main()
    shutil.rmtree(tmp_path / "runs")
    record = json.loads((tmp_path / "results/e2e/study/flat2x+lora_all_r64+train8k.train.json").read_text())
    assert (record["attempt_seconds"], record["val_loss_schedule"], record["precision"]) == ([300, 1500], 1.2,
                                                                                             "32-true")
    monkeypatch.setattr(sys, "argv", ["study_report", "e2e", "--record-run", "flat3x+lora_all_r64+train8k"])
    with pytest.raises(SystemExit, match="runs/e2e/flat3x.* to record"):  # nothing trained: nothing written
        study_report.main()


def test_a_stopped_attempt_that_saved_no_checkpoint_counts_nothing(tmp_path):
    version = tmp_path / "version_0"
    version.mkdir()
    (version / "config.yaml").write_text("seed_everything: 0\n")
    assert study_report.stopped_attempt_seconds(version) == 0


def test_rows_decoded_another_way_pool_their_seeds_and_filter_by_how_they_were_decoded(results, table, capsys):
    # what study.sh DECODE=... DECODING=no_repeat3 scores: a row per trained run (NAME_sN) and way of decoding it
    results("dense+lora_all_r64", 0.60, "32-true")
    results("dense+lora_all_r64_s1", 0.62, "32-true")
    results("flat2x+lora_all_r64", 0.50, "32-true")
    results("flat2x+lora_all_r64_s1", 0.52, "32-true")
    for seed, (dense, skip, plug) in {"": (0.66, 0.60, 0.30), "_s1": (0.62, 0.64, 0.34)}.items():
        results(f"dense+lora_all_r64{seed}@dense+no_repeat3", dense, "32-true")
        results(f"flat2x+lora_all_r64{seed}@flat2x+no_repeat3", skip, "32-true")
        results(f"dense+lora_all_r64{seed}@flat2x+no_repeat3", plug, "32-true")
    rows = table(study_report, "e2e", "--ceiling", "dense+lora_all_r64@dense+no_repeat3", "--only", "no_repeat3")
    assert {row[0]: row[6] for row in rows} == {  # test shares of the no_repeat3 ceiling's mean, 64
        "dense+lora_all_r64@dense+no_repeat3": "103%", "dense+lora_all_r64_s1@dense+no_repeat3": "97%",
        "flat2x+lora_all_r64@flat2x+no_repeat3": "94%", "flat2x+lora_all_r64_s1@flat2x+no_repeat3": "100%",
        "dense+lora_all_r64@flat2x+no_repeat3": "47%", "dense+lora_all_r64_s1@flat2x+no_repeat3": "53%"}
    study_report.main()  # again, for the seed table below the rows
    seeds = {line.split("|")[1].strip(): line.split("|")[-2].strip()
             for line in capsys.readouterr().out.split("\n\n")[1].splitlines()[2:]}
    assert seeds == {"dense+lora_all_r64@dense+no_repeat3": "100%", "flat2x+lora_all_r64@flat2x+no_repeat3": "97%",
                     "dense+lora_all_r64@flat2x+no_repeat3": "50%"}


def test_a_ceiling_whose_seeds_trained_in_two_precisions_is_refused(results, table):
    results("dense+lora_all_r64", 0.60, "bf16-mixed")
    results("dense+lora_all_r64_s1", 0.50, "32-true")
    with pytest.raises(SystemExit, match="different precisions"):
        table(study_report, "e2e", "--ceiling", "dense+lora_all_r64")


def test_a_run_resumes_only_in_the_precision_it_started_in(tmp_path):
    run = tmp_path / "flat2x+lora_all_r64"
    assert record_attempt(run, "bf16-mixed", MACHINE) is None
    assert record_attempt(run, "bf16-mixed", MACHINE | {"cpu": "another CPU"}) is None
    refusal = record_attempt(run, "32-true", MACHINE)
    assert "started in bf16-mixed and would resume in 32-true" in refusal
    record = json.loads((run / "trained_on.json").read_text())
    assert record == {"precision": "bf16-mixed", "machines": [MACHINE, MACHINE | {"cpu": "another CPU"}]}


def test_the_recorded_precision_is_what_the_study_configs_resolve_to_on_this_machine():
    base = ["benchmarks/quality/e2e/train_base.yaml", "benchmarks/quality/schedules/flat2x.yaml"]
    assert resolved_precision([*base, "benchmarks/quality/levers/fp32.yaml"]) == "32-true"
    assert resolved_precision(base) == ("bf16-mixed" if cpu_bf16_feature() else "32-true")


def test_the_seed_table_says_when_a_seed_was_not_scored_on_the_test_split(results, tmp_path, capsys, monkeypatch):
    # a seed whose checkpoint was lost after its dev split was scored keeps its dev score and no test score
    results("dense+lora_all_r64", 0.60, "32-true")
    results("dense+lora_all_r64_s1", 0.62, "32-true")
    results("dense+lora_all_r64_s2", 0.70, "32-true")
    (tmp_path / "results/e2e/study/dense+lora_all_r64_s2.test.json").unlink()
    monkeypatch.setattr(sys, "argv", ["study_report", "e2e", "--ceiling", "dense+lora_all_r64"])
    study_report.main()
    seed_row = capsys.readouterr().out.split("\n\n")[1].splitlines()[2]
    assert [cell.strip() for cell in seed_row.strip("|").split("|")][2:5] == ["3 (2 on test)", "-", "61.0 (60.0-62.0)"]


def test_an_epoch_row_is_its_run_s_and_a_run_records_its_peak_memory_and_cpu_time(results, table, tmp_path):
    """study.sh EPOCH=E scores RUN+epochE[_sN]: its precision (and so its share) is its run's; GNU time writes the
    peak resident memory and the CPU seconds of each attempt (and a note where one failed), and the record keeps the
    largest peak and the CPU seconds' sum."""
    assert study_report.trained_run("flat2x+five_epochs+epoch3_s1@flat2x+no_repeat3") == "flat2x+five_epochs_s1"
    assert study_report.trained_run("flat2x+five_epochs+epoch3") == "flat2x+five_epochs"
    assert study_report.trained_run("flat2x+epoch3x_s1") == "flat2x+epoch3x_s1"  # a lever that merely starts so
    results("dense+five_epochs+epoch1", 0.40, "32-true")
    results("flat2x+five_epochs+epoch1", 0.30, "bf16-mixed")
    stopped_and_resumed_run(tmp_path / "runs/e2e/flat2x+five_epochs", stopped_for=300, last_attempt=1500)
    (tmp_path / "runs/e2e/flat2x+five_epochs/max_rss_kb").write_text(
        "7340032\nCommand exited with non-zero status 1\n7864320\n")
    (tmp_path / "runs/e2e/flat2x+five_epochs/cpu_seconds").write_text(
        "290.5 9.25\nCommand exited with non-zero status 1\n1480.25 10.5\n")
    (tmp_path / "runs/e2e/dense+five_epochs").mkdir(parents=True)
    (tmp_path / "runs/e2e/dense+five_epochs/wall_seconds").write_text("60\n")
    (tmp_path / "runs/e2e/dense+five_epochs/trained_on.json").write_text(json.dumps({"precision": "bf16-mixed"}))
    (tmp_path / "runs/e2e/dense+five_epochs/lightning_logs/version_0").mkdir(parents=True)
    (tmp_path / "runs/e2e/dense+five_epochs/lightning_logs/version_0/metrics.csv").write_text("step\n0\n")
    summary = study_report.training_summary("e2e", "flat2x+five_epochs")
    assert (summary["max_rss_gib"], summary["cpu_seconds"], summary["cpu_seconds_attempts"]) == (7.5, 1790, 2)
    assert not {"max_rss_gib", "cpu_seconds"} & set(study_report.training_summary("e2e", "dense+five_epochs"))
    rows = {row[0]: row for row in table(study_report, "e2e", "--ceiling", "dense+five_epochs+epoch1")}
    assert rows["flat2x+five_epochs+epoch1"][1] == "32-true"  # its run's (the test's results() stub is not read)


FIVE = "lora_all_r64+fp32+accumulate2+five_epochs"  # a five-epoch run of the summarisation studies


def five_epoch_run(results, schedule: str, scores: dict[int, float], precision: str = "32-true",
                   levers: str = FIVE, seed: str = "") -> None:
    """A five-epoch run scored on test and dev: its own row is epoch 5, study.sh EPOCH=E rows (``+epochE``) the
    others; only the run itself records its training (10 minutes)."""
    run = f"{schedule}+{levers}"
    for epoch, score in scores.items():
        name = f"{run}{seed}" if epoch == 5 else f"{run}+epoch{epoch}{seed}"
        results(name, score, precision, splits=("test", "dev"))
        if epoch != 5:
            (study_report.RESULTS / "e2e/study" / f"{name}.train.json").unlink()


def test_the_epochs_curve_divides_each_epoch_by_the_dense_run_at_that_epoch(results, table):
    five_epoch_run(results, "dense", {1: 0.20, 3: 0.30, 5: 0.40})
    five_epoch_run(results, "dense", {1: 0.22, 3: 0.30, 5: 0.40}, seed="_s1")
    five_epoch_run(results, "flat2x", {1: 0.189, 3: 0.285, 5: 0.392})
    # EPOCH=5 scores the run's final checkpoint again: one model, not a second seed
    results("flat2x+lora_all_r64+fp32+accumulate2+five_epochs+epoch5", 0.392, "32-true", splits=("test", "dev"))
    # one-epoch runs, the learning rate annealed over that epoch, and their two-epoch twins: a line of their own
    for schedule, one, two in (("dense", 0.20, 0.25), ("flat2x", 0.10, 0.20)):
        results(f"{schedule}+lora_all_r64+fp32", one, "32-true", splits=("test", "dev"))
        results(f"{schedule}+lora_all_r64+fp32+two_epochs", two, "32-true", splits=("test", "dev"))
    results("flat3x+lora_all_r64+fp32", 0.10, "32-true", splits=("test", "dev"))  # one epoch count only
    rows = {(row[0], row[2]): row for row in table(curve, "e2e", "--axis", "epochs", "--metric", "rouge_l")}
    skip, dense = "flat2x+lora_all_r64+accumulate2+five_epochs", "dense+lora_all_r64+accumulate2+five_epochs"
    assert set(rows) == {(epoch, line) for epoch in ("1", "3", "5") for line in (skip, dense)} | {
        ("1", "dense+lora_all_r64"), ("2", "dense+lora_all_r64"), ("1", "flat2x+lora_all_r64"),
        ("2", "flat2x+lora_all_r64")}
    assert rows["1", dense][3:6] == ["2/2", "21.0", "100%"]
    assert rows["1", skip][3:] == ["1/1", "18.9", "90%", "18.9", "90%", "1.00x", "2"]  # 10 minutes x 1/5
    assert rows["3", skip][5] == "95%"
    assert rows["5", skip][3:6] == ["1/1", "39.2", "98%"]
    assert rows["5", skip][-1] == "10"
    assert (rows["1", "flat2x+lora_all_r64"][5], rows["2", "flat2x+lora_all_r64"][5]) == ("50%", "80%")
    assert curve.read_curve("e2e", curve.AXES["epochs"]).left_out == ["flat3x+lora_all_r64"]
    with pytest.raises(SystemExit, match="no study 'xsum'"):  # a study that scored nothing yet, or a typo
        table(curve, "xsum", "--axis", "epochs")


def test_an_epoch_point_scored_on_dev_alone_keeps_its_dev_share_and_says_where_its_speedup_is_from(results, table):
    # SPLITS=dev holds the test split back until a configuration is chosen
    five_epoch_run(results, "dense", {1: 0.20, 5: 0.40})
    five_epoch_run(results, "flat2x", {1: 0.18, 5: 0.36})
    (study_report.RESULTS / "e2e/study/flat2x+lora_all_r64+fp32+accumulate2+five_epochs+epoch1.test.json").unlink()
    rows = {(row[0], row[2]): row for row in table(curve, "e2e", "--axis", "epochs", "--metric", "rouge_l")}
    assert rows["1", "flat2x+lora_all_r64+accumulate2+five_epochs"][3:9] == ["0/1", "-", "-", "18.0", "90%",
                                                                             "1.00x (dev)"]


def test_the_epochs_curve_keeps_each_precision_apart(results, table):
    five_epoch_run(results, "dense", {1: 0.20, 5: 0.40})
    five_epoch_run(results, "flat2x", {1: 0.18, 5: 0.36})
    bf16 = "lora_all_r64+accumulate2+five_epochs"  # the same levers trained in bf16-mixed: their own ceiling
    five_epoch_run(results, "dense", {1: 0.10, 5: 0.30}, precision="bf16-mixed", levers=bf16)
    five_epoch_run(results, "flat2x", {1: 0.07, 5: 0.24}, precision="bf16-mixed", levers=bf16)
    rows = {(row[0], row[1], row[2]): row[5]
            for row in table(curve, "e2e", "--axis", "epochs", "--metric", "rouge_l")}
    line = "flat2x+lora_all_r64+accumulate2+five_epochs"
    assert (rows["1", "32-true", line], rows["5", "32-true", line]) == ("90%", "90%")
    assert (rows["1", "bf16-mixed", line], rows["5", "bf16-mixed", line]) == ("70%", "80%")


def test_a_lever_set_forms_its_own_line_and_its_ceiling_leaves_out_only_the_levers_named(results, table, tmp_path):
    five_epoch_run(results, "dense", {1: 0.20, 3: 0.30, 5: 0.40})
    five_epoch_run(results, "flat2x", {1: 0.18, 3: 0.27, 5: 0.36})
    joint = "lora_all_r64+fp32+accumulate2+joint+five_epochs"
    five_epoch_run(results, "flat2x", {1: 0.16, 5: 0.38}, levers=joint)
    line = "flat2x+lora_all_r64+accumulate2+joint+five_epochs"
    rows = {(row[0], row[2]): row for row in table(curve, "e2e", "--axis", "epochs", "--metric", "rouge_l")}
    assert rows["1", line][4:6] == ["16.0", "-"]  # no dense run trained with joint: no share
    plot = tmp_path / "epochs.png"
    rows = {(row[0], row[2]): row for row in table(curve, "e2e", "--axis", "epochs", "--metric", "rouge_l",
                                                   "--ceiling-without", "joint", "--plot", str(plot))}
    assert (rows["1", line][5], rows["5", line][5]) == ("80%", "95%")  # of the dense five-epoch run without joint
    assert rows["3", "flat2x+lora_all_r64+accumulate2+five_epochs"][5] == "90%"
    assert ("3", line) not in rows
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_the_plot_names_every_line_though_a_configuration_is_scored_on_dev_alone(results, tmp_path):
    five_epoch_run(results, "dense", {1: 0.20, 3: 0.30, 5: 0.40})
    five_epoch_run(results, "flat2x", {1: 0.18, 3: 0.27, 5: 0.36})
    for path in (study_report.RESULTS / "e2e/study").glob("flat2x+*.test.json"):
        path.unlink()  # flat 2x waits for its test scores: on the dev panels alone
    figure = curve.plot(curve.read_curve("e2e", curve.AXES["epochs"], []), "rouge_l", str(tmp_path / "epochs.png"))
    assert [text.get_text() for text in figure.legends[0].get_texts()] == ["dense, 32-true", "flat2x, 32-true"]
