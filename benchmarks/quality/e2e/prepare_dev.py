"""Draw the E2E study's matched dev split: MRs of the official dev set whose attribute-count histogram is the test
split's.

    python benchmarks/quality/e2e/prepare_dev.py ../shared/data/e2e/official/devset.csv \
        ../shared/data/e2e/subsets/testset_w_refs_100mr.csv runs/e2e/data/devset_matched_100mr.csv

The 50-MR dev subset the first study chose on has 24 of 50 MRs with 7-8 attributes; the 100-MR test split has 80
of 100, and long outputs are where the skipped path loses attributes, so choices made on it overstated the test
share. This split takes, for each attribute count, the test split's share of ``--size`` MRs (largest remainder),
drawn with a fixed seed from the official *dev* set only (never the test set), every reference of each drawn MR
kept. The file is written next to the runs, never into the project; an existing one is left as it is, so study
rows stay comparable.
"""

from __future__ import annotations

import argparse
import csv
import random
from collections import Counter
from pathlib import Path


def attribute_count(mr: str) -> int:
    """Number of attributes of an E2E meaning representation (``name[X], area[Y], ...``)."""
    return mr.count("[")


def read_references(path: Path) -> dict[str, list[str]]:
    """Every MR of an E2E csv with its references, in file order."""
    references: dict[str, list[str]] = {}
    with path.open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            references.setdefault(row["mr"], []).append(row["ref"])
    return references


def allocate(histogram: Counter, size: int) -> dict[int, int]:
    """``size`` MRs split over attribute counts in proportion to ``histogram`` (largest-remainder rounding)."""
    total = sum(histogram.values())
    exact = {count: size * n / total for count, n in histogram.items()}
    quota = {count: int(value) for count, value in exact.items()}
    by_remainder = sorted(exact, key=lambda count: (quota[count] - exact[count], count))
    for count in by_remainder[: size - sum(quota.values())]:
        quota[count] += 1
    return quota


def matched_split(dev: dict[str, list[str]], test_mrs: list[str], size: int, seed: int) -> list[str]:
    """MRs of ``dev`` whose attribute-count histogram matches that of ``test_mrs``, in dev-file order."""
    quota = allocate(Counter(attribute_count(mr) for mr in test_mrs), size)
    rng = random.Random(seed)
    chosen: set[str] = set()
    for count, wanted in sorted(quota.items()):
        pool = [mr for mr in dev if attribute_count(mr) == count]
        if len(pool) < wanted:
            raise SystemExit(f"the dev set has {len(pool)} MRs with {count} attributes, {wanted} are needed")
        chosen.update(rng.sample(pool, wanted))
    return [mr for mr in dev if mr in chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dev", type=Path, help="the official E2E dev csv (mr, ref)")
    parser.add_argument("test", type=Path, help="the test split whose histogram to match")
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.out.is_file():
        return
    dev = read_references(args.dev)
    mrs = matched_split(dev, list(read_references(args.test)), args.size, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    staging = args.out.with_suffix(".partial")
    with staging.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["mr", "ref"])
        writer.writerows((mr, ref) for mr in mrs for ref in dev[mr])
    staging.replace(args.out)
    histogram = sorted(Counter(attribute_count(mr) for mr in mrs).items())
    print(f"{args.out}: {len(mrs)} MRs, attribute counts {histogram}")


if __name__ == "__main__":
    main()
