"""Tabulate the E2E data-scale curve: each configuration's share of the same-budget dense ceiling per training size.

    python benchmarks/data_curve.py e2e > benchmarks/results/e2e/data_curve.md

A size is a lever of benchmarks/study.sh (none: the study base's 2,000 pairs; ``train4k``, ``train8k``: the
subsets of benchmarks/e2e/prepare_train.py); every row at a size is divided by the dense ceiling trained on the same
pairs (``dense+lora_all_r64`` plus that lever), the mean of its seeds, on the same split, as benchmarks/study_report.py
does for one size. A configuration's scores are the mean of its seeds (``NAME``, ``NAME_sN``).
"""

from __future__ import annotations

import argparse
import json
import re

from benchmarks.study_report import RESULTS, ceiling_means, training_summary

SIZES = {"": 2000, "train4k": 4000, "train8k": 8000}  # lever -> training pairs
CEILING = "dense+lora_all_r64"
CONFIGURATIONS = ("dense+lora_all_r64", "flat2x+lora_all_r64", "calibrated2x+lora_all_r64", "flat3x+lora_all_r64",
                  "calibrated3x+lora_all_r64")


def seed_runs(names: list[str], name: str) -> list[str]:
    """``name`` and its other seeds ``name_sN``."""
    return [n for n in names if n == name or re.fullmatch(re.escape(name) + r"_s\d+", n)]


def mean(scores: dict[str, dict[str, dict]], runs: list[str], split: str, key: str) -> float | None:
    """Mean of ``key`` over the runs scored on ``split`` (``None``: none was)."""
    values = [scores[run][split][key] for run in runs if split in scores[run]]
    return sum(values) / len(values) if values else None


def row(study: str, scores: dict[str, dict[str, dict]], runs: list[str], ceiling: dict[str, float], metric: str
        ) -> list[str]:
    """The cells of one configuration at one size, after its name."""
    cells = ["/".join(str(sum(split in scores[run] for run in runs)) for split in ("test", "devmatch"))]
    for split in ("test", "devmatch"):
        value = mean(scores, runs, split, metric)
        cells.append("-" if value is None else f"{100 * value:.1f}")
        cells.append("-" if value is None or split not in ceiling else f"{100 * value / ceiling[split]:.0f}%")
    speedup = mean(scores, runs, "test", "ideal_speedup_over_generated_tokens")
    cells.append("-" if speedup is None else f"{speedup:.2f}x")
    trained = [t for t in (training_summary(study, run) for run in runs) if t]
    cells.append(f"{sum(t['wall_seconds'] for t in trained) / 60 / len(trained):.0f}" if trained else "-")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("--metric", default="bleu")
    args = parser.parse_args()
    scores: dict[str, dict[str, dict]] = {}
    for path in (RESULTS / args.study / "study").glob("*.json"):
        name, _, split = path.name.removesuffix(".json").rpartition(".")
        if split in ("dev", "devmatch", "test"):
            scores.setdefault(name, {})[split] = json.loads(path.read_text())
    print(f"| training pairs | configuration | seeds: test / matched dev | test {args.metric} "
          f"| test share of the same-budget ceiling | matched dev {args.metric} | matched dev share "
          "| layer-count speedup over generated tokens (test) | train minutes (mean) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for lever, pairs in SIZES.items():
        suffix = f"+{lever}" if lever else ""
        if not seed_runs(list(scores), CEILING + suffix):
            continue
        ceiling = ceiling_means(scores, CEILING + suffix, args.metric)
        for configuration in CONFIGURATIONS:
            runs = seed_runs(list(scores), configuration + suffix)
            if runs:
                cells = [str(pairs), configuration, *row(args.study, scores, runs, ceiling, args.metric)]
                print(f"| {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
