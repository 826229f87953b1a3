"""Draw the E2E study's larger training subsets, each containing every smaller one (the data-scale curve).

    python benchmarks/quality/e2e/prepare_train.py ../shared/data/e2e/official/trainset.csv runs/e2e/data \
        --sizes 4000 8000

The first 2,000 pairs are those of the shipped ``trainset_2000.csv`` (``random.Random(0).sample(range(42061),
2000)``, see its SOURCE.txt), so the curve's first point is the study's existing rows; the next ones are taken in
the order of a seeded shuffle of the remaining pairs. A subset of N pairs is the first N of that order, written in
the official file's row order as ``trainset_N.csv``. Files are written next to the runs, never into the project; an
existing one is left as it is.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

SHIPPED_SIZE = 2000  # the pairs of ../shared/data/e2e/subsets/trainset_2000.csv


def draw_order(total: int, seed: int = 0) -> list[int]:
    """Row indices in draw order: the shipped 2,000-pair subset's, then a seeded shuffle of the rest."""
    first = random.Random(seed).sample(range(total), SHIPPED_SIZE)
    chosen = set(first)
    rest = [index for index in range(total) if index not in chosen]
    random.Random(seed).shuffle(rest)
    return first + rest


def subset(rows: list[list[str]], size: int, seed: int = 0) -> list[list[str]]:
    """The first ``size`` rows of the draw order, in file order."""
    if not SHIPPED_SIZE <= size <= len(rows):
        raise SystemExit(f"--sizes: {size} is invalid: allowed {SHIPPED_SIZE}..{len(rows)} (the training set's pairs)")
    return [rows[index] for index in sorted(draw_order(len(rows), seed)[:size])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train", type=Path, help="the official E2E training csv (mr, ref)")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    args = parser.parse_args()
    with args.train.open(newline="", encoding="utf-8") as file:
        header, *rows = csv.reader(file)
    for size in args.sizes:
        out = args.out_dir / f"trainset_{size}.csv"
        if out.is_file():
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_suffix(".partial")
        with staging.open("w", newline="", encoding="utf-8") as file:
            csv.writer(file).writerows([header, *subset(rows, size)])
        staging.replace(out)
        print(f"{out}: {size} pairs")


if __name__ == "__main__":
    main()
