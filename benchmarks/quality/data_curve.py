"""Tabulate the E2E data-scale curve: each configuration's share of the same-budget dense ceiling per training size.

    python -m benchmarks.quality.data_curve e2e --plot benchmarks/results/e2e/data_curve.png \
        > benchmarks/results/e2e/data_curve.md

A size is a lever of benchmarks/quality/study.sh (none: the study base's 2,000 pairs; ``train4k``, ``train8k``: the
subsets of benchmarks/quality/e2e/prepare_train.py); the ``fp32`` lever may be stacked on it. A configuration's scores
are the mean of its seeds (``NAME``, ``NAME_sN``) that trained in one precision (as recorded,
benchmarks/quality/trained_on.py), and every row is divided by the dense ceiling trained on the same pairs in the same
precision (``dense+lora_all_r64`` plus the same levers), the mean of its seeds, on the same split, as
benchmarks/quality/study_report.py does for one size.
"""

from __future__ import annotations

import argparse
import json
import re

from benchmarks.quality.study_report import RESULTS, attempt_seconds, precision, training_summary

SIZES = {"": 2000, "train4k": 4000, "train8k": 8000}  # lever -> training pairs
PRECISION_LEVERS = ("fp32",)  # a precision lever keeps a row on the curve, in its own precision's rows
CEILING = "dense+lora_all_r64"
CONFIGURATIONS = ("dense+lora_all_r64", "flat2x+lora_all_r64", "calibrated2x+lora_all_r64", "flat3x+lora_all_r64",
                  "calibrated3x+lora_all_r64")


def curve_point(name: str) -> tuple[int, str] | None:
    """``(training pairs, configuration)`` of a scored run on the curve; ``None`` for any other run (another lever,
    or a run decoded under another schedule, ``NAME@SCHEDULE``)."""
    if "@" in name:
        return None
    parts = re.sub(r"_s\d+$", "", name).split("+")
    configuration, levers = "+".join(parts[:2]), parts[2:]
    sizes = [lever for lever in levers if lever in SIZES]
    if configuration not in CONFIGURATIONS or len(sizes) > 1 or set(levers) - set(sizes) - set(PRECISION_LEVERS):
        return None
    return SIZES[sizes[0] if sizes else ""], configuration


def mean(scores: dict[str, dict[str, dict]], runs: list[str], split: str, key: str) -> float | None:
    """Mean of ``key`` over the runs scored on ``split`` (``None``: none was)."""
    values = [scores[run][split][key] for run in runs if split in scores[run]]
    return sum(values) / len(values) if values else None


def seeds_scored(scores: dict[str, dict[str, dict]], runs: list[str], split: str) -> int:
    """How many of the runs (a point's seeds) were scored on ``split``."""
    return sum(split in scores[run] for run in runs)


def share_of_ceiling(scores: dict[str, dict[str, dict]], runs: list[str], ceiling: list[str], split: str,
                     metric: str) -> tuple[float | None, float | None]:
    """The runs' mean ``metric`` on ``split`` and its share (%) of the ceiling seeds' mean there, the one share that
    the table and the plot both show (``None`` where the runs, or the ceiling, were not scored on the split)."""
    value, dense = mean(scores, runs, split, metric), mean(scores, ceiling, split, metric)
    return value, (100 * value / dense if value is not None and dense else None)


def row(study: str, scores: dict[str, dict[str, dict]], runs: list[str], ceiling: list[str], metric: str
        ) -> list[str]:
    """The cells of one configuration at one size and precision, after its name; ``ceiling``: the dense seeds of
    that size and precision (none: no shares)."""
    cells = ["/".join(str(seeds_scored(scores, runs, split)) for split in ("test", "devmatch"))]
    for split in ("test", "devmatch"):
        value, share = share_of_ceiling(scores, runs, ceiling, split, metric)
        cells.append("-" if value is None else f"{100 * value:.1f}")
        cells.append("-" if share is None else f"{share:.0f}%")
    speedup = mean(scores, runs, "test", "ideal_speedup_over_generated_tokens")
    cells.append("-" if speedup is None else f"{speedup:.2f}x")
    trained = [t for t in (training_summary(study, run) for run in runs) if t]
    timed = [seconds for seconds in map(attempt_seconds, trained) if seconds]  # a record may have lost its time
    resumed = sum(len(attempts) > 1 for attempts in timed)
    minutes = f"{sum(map(sum, timed)) / 60 / len(timed):.0f}" if timed else "-"
    notes = []
    if resumed:
        notes.append(f"{resumed} resumed")
    if len(timed) < len(trained):
        notes.append(f"{len(trained) - len(timed)} untimed")
    cells.append(minutes + (f" ({', '.join(notes)})" if notes else ""))
    return cells


def curve_groups(study: str) -> tuple[dict[str, dict[str, dict]], dict[tuple[int, str, str], list[str]]]:
    """The study's scores by run and split, and its runs on the curve grouped by (training pairs, precision,
    configuration): the seeds of each point."""
    scores: dict[str, dict[str, dict]] = {}
    for path in (RESULTS / study / "study").glob("*.json"):
        name, _, split = path.name.removesuffix(".json").rpartition(".")
        if split in ("dev", "devmatch", "test"):
            scores.setdefault(name, {})[split] = json.loads(path.read_text())
    groups: dict[tuple[int, str, str], list[str]] = {}
    for name in sorted(scores):
        point = curve_point(name)
        if point:
            pairs, configuration = point
            groups.setdefault((pairs, precision(study, name), configuration), []).append(name)
    return scores, groups


def plot(scores: dict[str, dict[str, dict]], groups: dict[tuple[int, str, str], list[str]], metric: str,
         path: str) -> None:
    """Each skip configuration's share of its same-budget, same-precision ceiling against the training pairs, one
    panel per split, a line per configuration and precision; a hollow marker is a one-seed point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({pairs for pairs, _, _ in groups})
    lines = sorted({(trained_in, configuration) for _, trained_in, configuration in groups if configuration != CEILING})
    figure, panels = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for panel, (split, title) in zip(panels, (("test", "test split"), ("devmatch", "matched dev split")), strict=True):
        for trained_in, configuration in lines:
            points = []  # (pairs, share in %, seeds scored on the split)
            for pairs in sizes:
                runs = groups.get((pairs, trained_in, configuration), [])
                _, share = share_of_ceiling(scores, runs, groups.get((pairs, trained_in, CEILING), []), split, metric)
                if share is not None:
                    points.append((pairs, share, seeds_scored(scores, runs, split)))
            if not points:
                continue
            color = f"C{CONFIGURATIONS.index(configuration)}"  # one colour a configuration, a dash a precision
            panel.plot([pairs for pairs, _, _ in points], [share for _, share, _ in points],
                       "-" if trained_in == "32-true" else ":", color=color,
                       label=f"{configuration.split('+')[0]}, {trained_in}")
            for pairs, share, seeds in points:
                panel.plot(pairs, share, "o", color=color, markerfacecolor=color if seeds > 1 else "white")
        panel.axhline(100, color="grey", linewidth=0.8)
        panel.set_xscale("log", base=2)
        panel.set_xticks(sizes, [f"{pairs:,}" for pairs in sizes])
        panel.set_xlabel("training pairs (one epoch)")
        panel.set_title(title)
        panel.grid(alpha=0.3)
    panels[0].set_ylabel(f"{metric} share of the same-budget dense ceiling (%)")
    panels[0].legend(fontsize=8, title="filled marker: two or more seeds", title_fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("--metric", default="bleu")
    parser.add_argument("--plot", metavar="PNG", help="also draw the skip rows' shares against the training pairs")
    args = parser.parse_args()
    scores, groups = curve_groups(args.study)
    print(f"| training pairs | precision | configuration | seeds: test / matched dev | test {args.metric} "
          f"| test share of the same-budget ceiling | matched dev {args.metric} | matched dev share "
          "| layer-count speedup over generated tokens (test) | train minutes (mean) |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (pairs, trained_in, configuration), runs in sorted(
            groups.items(), key=lambda item: (item[0][0], item[0][1], CONFIGURATIONS.index(item[0][2]))):
        ceiling = groups.get((pairs, trained_in, CEILING), [])
        cells = [str(pairs), trained_in, configuration, *row(args.study, scores, runs, ceiling, args.metric)]
        print(f"| {' | '.join(cells)} |")
    if args.plot:
        plot(scores, groups, args.metric, args.plot)


if __name__ == "__main__":
    main()
