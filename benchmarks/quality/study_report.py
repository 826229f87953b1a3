"""Tabulate a quality-at-speed study (benchmarks/quality/study.sh) from its scores and training logs.

    python benchmarks/quality/study_report.py e2e --ceiling dense+lora_all_r64 > benchmarks/results/e2e/study_table.md

Reads ``benchmarks/results/STUDY/study/NAME.{dev,test}.json`` (written by study.sh) and, for each trained run,
``runs/STUDY/NAME`` (training time of each attempt, final validation losses under the run's schedule and dense, and
the precision and machines of ``trained_on.json``). When the run directory is gone, the training columns come from
``NAME.train.json`` beside the scores, which study.sh writes as a run finishes training (``--record-run NAME``)
and ``--record`` writes for every row, so the table can be rebuilt from the committed results alone. Shares of the
ceiling are of its BLEU (E2E) or ROUGE-L (summarisation) on the same split, and only of rows trained in the
ceiling's precision; seeds are pooled only within one precision.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
from pathlib import Path

from skiptrain.core.output_dir import write_whole

STUDIES = Path("benchmarks/quality")
RESULTS = Path("benchmarks/results")
RUNS = Path("runs")
SPLITS = ("dev", "devmatch", "test")  # devmatch: the dev split with the test split's attribute-count histogram
UNRECORDED = "unrecorded"


def study_env(study: str) -> dict[str, str]:
    """The study's ``TRAIN_BASE``, ``DEV_DATA``, ``TEST_DATA`` and ``PREPARE``, read as ``study.sh`` reads them
    (sourced)."""
    script = 'source "$1" && printf "%s\\0" "$TRAIN_BASE" "$DEV_DATA" "$TEST_DATA" "${PREPARE:-}"'
    values = subprocess.run(["bash", "-c", script, "-", STUDIES / study / "study.env"], capture_output=True,
                            text=True, check=True).stdout.split("\0")
    return dict(zip(("TRAIN_BASE", "DEV_DATA", "TEST_DATA", "PREPARE"), values, strict=False))


def row_configs(study: str, name: str) -> list[str]:
    """The configs benchmarks/quality/study.sh stacks for study row ``name`` (SCHEDULE+LEVER+..., seed dropped): the
    study's base, the schedule and each lever as committed (study.sh then substitutes the run paths in the levers)."""
    schedule, *levers = seedless(name).split("+")
    return [study_env(study)["TRAIN_BASE"], f"{STUDIES}/schedules/{schedule}.yaml",
            *(f"{STUDIES}/levers/{lever}.yaml" for lever in levers)]


def read_scores(study: str) -> dict[str, dict[str, dict]]:
    """The study's scores (``benchmarks/results/STUDY/study/NAME.SPLIT.json``) by scored row and split."""
    scores: dict[str, dict[str, dict]] = {}
    for split in SPLITS:
        for path in sorted((RESULTS / study / "study").glob(f"*.{split}.json")):
            scores.setdefault(path.name.rsplit(".", 2)[0], {})[split] = json.loads(path.read_text())
    return scores


def training_summary(study: str, name: str) -> dict | None:
    """Wall time and final validation losses of a run, from its run directory or the recorded copy."""
    recorded = RESULTS / study / "study" / f"{name}.train.json"
    run = RUNS / study / name
    if not (run / "wall_seconds").is_file():
        return json.loads(recorded.read_text()) if recorded.is_file() else None
    trained_on = run / "trained_on.json"  # benchmarks/quality/trained_on.py: precision and the machine of each attempt
    # a resumed run logs each attempt into its own version_N: read them in order
    def version(log: Path) -> int:
        return int(log.parent.name.removeprefix("version_"))

    logs = sorted(run.glob("lightning_logs/version_*/metrics.csv"), key=version)
    rows = [row for log in logs for row in csv.DictReader(log.open())]
    validated = [r for r in rows if r.get("val/loss_skip")]  # none where the run's validation never came round
    final = validated[-1] if validated else {}
    steps = max(int(r["step"]) for r in rows) + 1
    wall_seconds = int((run / "wall_seconds").read_text())
    # GNU time's lines of each attempt that ended (study.sh): peak resident KiB; user and system CPU seconds
    peaks, cpu = (time_lines(run / name, fields) for name, fields in (("max_rss_kb", 1), ("cpu_seconds", 2)))
    memory = {"max_rss_gib": round(max(p[0] for p in peaks) / 2**20, 1)} if peaks else {}
    cpu_time = {"cpu_seconds": round(sum(map(sum, cpu))), "cpu_seconds_attempts": len(cpu)} if cpu else {}
    return {"wall_seconds": wall_seconds, "steps": steps, **memory, **cpu_time,
            "attempt_seconds": [*map(stopped_attempt_seconds, [log.parent for log in logs[:-1]]), wall_seconds],
            "val_loss_schedule": float(final["val/loss_skip"]) if final else None,
            "val_loss_dense": float(final["val/loss_dense"]) if final else None,
            **(json.loads(trained_on.read_text()) if trained_on.is_file() else {})}


def time_lines(path: Path, fields: int) -> list[list[float]]:
    """The numeric lines of a file GNU time appends to (its notes, e.g. a non-zero exit status, left out)."""
    lines = [line.split() for line in path.read_text().splitlines()] if path.is_file() else []
    return [[float(x) for x in line] for line in lines
            if len(line) == fields and all(x.replace(".", "", 1).isdigit() for x in line)]


def record_training(study: str, name: str) -> dict | None:
    """Write run ``name``'s training summary beside its scores (``NAME.train.json``), where the tables find it once
    the run directory is gone; the summary, or ``None`` (nothing written) for a run with neither."""
    trained = training_summary(study, name)
    if trained is not None:
        write_whole(RESULTS / study / "study" / f"{name}.train.json", json.dumps(trained, indent=2) + "\n")
    return trained


def stopped_attempt_seconds(version: Path) -> int:
    """What a stopped attempt (its ``lightning_logs/version_N``) trained for: from the ``config.yaml`` LightningCLI
    writes as fit starts to its last checkpoint, which the next attempt resumed from (0: it saved none). The work
    after that checkpoint was lost with the stop, so it is not counted."""
    config, checkpoint = version / "config.yaml", version / "checkpoints" / "last.ckpt"
    if not (config.is_file() and checkpoint.is_file()):
        return 0
    return max(0, round(checkpoint.stat().st_mtime - config.stat().st_mtime))


def trained_precision(trained: dict | None) -> str:
    """The precision a run trained in, from its training summary."""
    return (trained or {}).get("precision", UNRECORDED)


def trained_run(name: str) -> str:
    """The run a scored row comes from: ``NAME`` for ``NAME@DECODE`` (decoded otherwise) and for ``...+epochE[_sN]``
    (its checkpoint at the end of epoch E, study.sh's EPOCH)."""
    return re.sub(r"\+epoch\d+(?=_s\d+$|$)", "", name.split("@")[0])


def precision(study: str, name: str) -> str:
    """The precision the run of scored row ``name`` (:func:`trained_run`) trained in, as recorded."""
    return trained_precision(training_summary(study, trained_run(name)))


def attempt_seconds(trained: dict) -> list[int]:
    """The training seconds of each attempt of a run: a stopped run resumes from its ``last.ckpt`` in a new attempt,
    and study.sh's ``wall_seconds`` is the last attempt's alone (a run recorded before attempts were: that one).
    None for a run recorded without its run directory, whose time went with it (``wall_seconds`` null)."""
    if trained.get("wall_seconds") is None:
        return []
    return trained.get("attempt_seconds", [trained["wall_seconds"]])


def train_minutes(trained: dict | None) -> str:
    """A run's training time in minutes, over all its attempts, saying how many there were."""
    seconds = attempt_seconds(trained) if trained else []
    if not seconds:
        return "-"
    return f"{sum(seconds) / 60:.0f}" + (f" ({len(seconds)} attempts)" if len(seconds) > 1 else "")


def share(split: dict | None, ceiling: float | None, metric: str) -> str:
    """``split``'s ``metric`` as a share of the ceiling's (``-`` where either is missing)."""
    return f"{100 * split[metric] / ceiling:.0f}%" if split and ceiling else "-"


def seedless(name: str) -> str:
    """A scored run's configuration: its name without the seed, ``NAME_sN[@DECODE]`` -> ``NAME[@DECODE]``."""
    return re.sub(r"_s\d+(?=@|$)", "", name)


def levers(name: str) -> set[str]:
    """Everything a scored run is named by: its schedule and levers, and the schedule and decoding option it was
    decoded with (``NAME@DECODE+OPTION``, study.sh's DECODE and DECODING)."""
    return set(re.split(r"[+@]", seedless(name)))


def seed_runs(names: list[str], name: str) -> list[str]:
    """``name`` and its other seeds (``NAME_sN``, or ``NAME_sN@DECODE`` for ``NAME@DECODE``)."""
    return [n for n in names if seedless(n) == name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("--ceiling", help="the dense run the shares are of (required for a table)")
    parser.add_argument("--metric", default="bleu", help="bleu (E2E) or rouge_l")
    parser.add_argument("--record", action="store_true", help="also write NAME.train.json beside the scores")
    parser.add_argument("--record-run", metavar="NAME", help="only write NAME.train.json from runs/STUDY/NAME, as "
                        "study.sh does when a run finishes training, and print no table")
    parser.add_argument("--only", metavar="LEVER", action="append", default=[],
                        help="only the runs with this lever (e.g. fp32: rows trained side by side with their own "
                        "ceiling); repeatable")
    parser.add_argument("--without", metavar="LEVER", action="append", default=[],
                        help="only the runs without this lever (e.g. train4k and train8k, for the table of the "
                        "2,000-pair rows); repeatable")
    args = parser.parse_args()
    if args.record_run:
        if record_training(args.study, args.record_run) is None:
            raise SystemExit(f"no run {RUNS / args.study / args.record_run} to record (its wall_seconds is missing)")
        return
    if not args.ceiling:
        parser.error("--ceiling is required for a table")
    scores = {name: splits for name, splits in read_scores(args.study).items()
              if set(args.only) <= levers(name) and not set(args.without) & levers(name)}
    ceiling_precision, ceiling = ceiling_means(args.study, scores, args.ceiling, args.metric)
    print(f"| run | precision | dev {args.metric} | matched dev {args.metric} | matched dev share | test {args.metric} "
          "| test share of ceiling | test ROUGE-L | test ROUGE-1/2 | mean layers / generated token (test) "
          "| ideal speedup over generated tokens | nominal ideal | dev loss: schedule / dense | train minutes |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, splits in sorted(scores.items(), key=lambda item: -item[1].get("dev", {}).get(args.metric, 0)):
        dev, devmatch, test = splits.get("dev"), splits.get("devmatch"), splits.get("test")
        run = trained_run(name)
        trained = record_training(args.study, run) if args.record and run == name else training_summary(args.study, run)

        def value(split, key, scale=100.0, digits=1):
            return f"{split[key] * scale:.{digits}f}" if split and split.get(key) is not None else "-"

        trained_in = trained_precision(trained)
        shares = ceiling if trained_in == ceiling_precision else {}  # a share is never taken across precisions

        losses = (f"{trained['val_loss_schedule']:.3f} / {trained['val_loss_dense']:.3f}"
                  if trained and trained["val_loss_schedule"] is not None else "-")  # None: the run validated nothing
        print(f"| {name} | {trained_in} | {value(dev, args.metric)} | {value(devmatch, args.metric)} "
              f"| {share(devmatch, shares.get('devmatch'), args.metric)} | {value(test, args.metric)} "
              f"| {share(test, shares.get('test'), args.metric)} | "
              f"{value(test, 'rouge_l')} | {value(test, 'rouge_1')}/{value(test, 'rouge_2')} | "
              f"{value(test, 'mean_layers_per_generated_token', 1.0)} | "
              f"{value(test, 'ideal_speedup_over_generated_tokens', 1.0, 2)}x | "
              f"{value(test, 'nominal_ideal_speedup', 1.0, 2)}x | {losses} | {train_minutes(trained)} |")
    print_seed_spread(args.study, scores, ceiling_precision, ceiling, args.metric)


def ceiling_means(study: str, scores: dict[str, dict[str, dict]], ceiling: str, metric: str
                  ) -> tuple[str, dict[str, float]]:
    """The ceiling's precision, and its score per split as the mean over its seeds (``CEILING`` and ``CEILING_sN``):
    every share in the tables divides by this one number. Its seeds must share one precision."""
    names = seed_runs(list(scores), ceiling)
    if not names:
        raise SystemExit(f"no scores of the ceiling run {ceiling!r} under {RESULTS}")
    precisions = {name: precision(study, name) for name in names}
    if len(set(precisions.values())) > 1:
        raise SystemExit(f"the seeds of the ceiling {ceiling!r} trained in different precisions ({precisions}): a "
                         "ceiling is the mean of seeds of one precision")
    means = {}
    for split in SPLITS:
        values = [scores[name][split][metric] for name in names if split in scores[name]]
        if values:
            means[split] = sum(values) / len(values)
    return precisions[names[0]], means


def print_seed_spread(study: str, scores: dict[str, dict[str, dict]], ceiling_precision: str,
                      ceiling: dict[str, float], metric: str) -> None:
    """Configurations run with several seeds (``NAME`` is seed 0, ``NAME_sN`` seed N) in one precision: mean and range
    per split, and the test mean as a share of the ceiling's test mean where it is the ceiling's precision."""
    seeds: dict[tuple[str, str], list[dict[str, dict]]] = {}
    for name, splits in scores.items():
        seeds.setdefault((seedless(name), precision(study, name)), []).append(splits)

    def spread(runs: list[dict[str, dict]], split: str) -> tuple[float, str]:
        values = [100 * run[split][metric] for run in runs if split in run]
        if not values:  # no seed scored on this split
            return 0.0, "-"
        mean = sum(values) / len(values)
        return mean, f"{mean:.1f} ({min(values):.1f}-{max(values):.1f})"

    several = {name: runs for name, runs in seeds.items() if len(runs) > 1}
    if not several or "test" not in ceiling:
        return
    print(f"\n| configuration | precision | seeds | dev {metric}: mean (range) | test {metric}: mean (range) "
          "| test mean, share of the ceiling's |")
    print("|---|---|---:|---:|---:|---:|")
    for (name, trained_in), runs in sorted(several.items(), key=lambda item: -spread(item[1], "test")[0]):
        test_mean, test_text = spread(runs, "test")
        share = f"{test_mean / ceiling['test']:.0f}%" if trained_in == ceiling_precision else "-"
        tested = sum("test" in run for run in runs)  # a seed whose checkpoint was lost may lack the test split
        count = f"{len(runs)}" + (f" ({tested} on test)" if tested < len(runs) else "")
        print(f"| {name} | {trained_in} | {count} | {spread(runs, 'dev')[1]} | {test_text} | {share} |")


if __name__ == "__main__":
    main()
