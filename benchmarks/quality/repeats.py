"""How often a study's outputs repeat themselves: a failure of the skipped path that ROUGE only sees as lost overlap.

    python -m benchmarks.quality.repeats cnndm dense+lora_all_r64 dense+lora_all_r64@flat2x flat2x+lora_all_r64 \
        --references ../shared/data/cnn_dailymail/splits/test_200.csv --column highlights

Reads ``benchmarks/results/STUDY/study/NAME.SPLIT.outputs.jsonl`` (written by ``score.py``; SPLIT: ``--split``,
default test) and prints a Markdown table: per run, the share of outputs that say some word trigram more than once,
the share of all word trigrams that repeat an earlier one in the same output, and the mean output length in words.
``--references`` (a CSV or JSON-lines file, ``--column`` its reference column) adds the same numbers for the
references, the rate a summary of that data set repeats itself by nature. Words are whitespace-separated and
lower-cased.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from benchmarks.quality.study_report import RESULTS


def repetition(texts: list[str]) -> tuple[float, float, float]:
    """(share of texts with a repeated word trigram, share of trigrams that repeat, mean words) over ``texts``."""
    repeating = repeated = trigrams = words = 0
    for text in texts:
        tokens = text.lower().split()
        grams = [tuple(tokens[i:i + 3]) for i in range(len(tokens) - 2)]
        repeats = len(grams) - len(set(grams))
        repeating += repeats > 0
        repeated += repeats
        trigrams += len(grams)
        words += len(tokens)
    return repeating / len(texts), repeated / max(trigrams, 1), words / len(texts)


def references(path: Path, column: str) -> list[str]:
    """The ``column`` of a CSV or JSON-lines file, in row order."""
    with path.open(newline="") as file:
        rows = csv.DictReader(file) if path.suffix == ".csv" else map(json.loads, file)
        return [row[column] for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("runs", nargs="+", help="scored runs (NAME or NAME@SCHEDULE)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--references", type=Path, help="the split's data file, for the references' own rate")
    parser.add_argument("--column", help="the references' column in that file")
    args = parser.parse_args()
    if args.references and not args.column:
        parser.error("--references needs --column, the name of the reference column")
    rows = {}
    for run in args.runs:
        path = RESULTS / args.study / "study" / f"{run}.{args.split}.outputs.jsonl"
        rows[run] = repetition([json.loads(line)["prediction"] for line in path.open()])
    if args.references:
        rows["references"] = repetition(references(args.references, args.column))
    print(f"| {args.split} outputs of | outputs repeating a word trigram | repeated trigrams | mean words |")
    print("|---|---:|---:|---:|")
    for name, (repeating, repeated, words) in rows.items():
        print(f"| {name} | {100 * repeating:.0f}% | {100 * repeated:.1f}% | {words:.1f} |")


if __name__ == "__main__":
    main()
