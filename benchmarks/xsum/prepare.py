"""Split the 1,000 XSum articles by row into train (0-759), dev (760-799) and test (800-999) JSON-lines files.

    python benchmarks/xsum/prepare.py ../shared/data/xsum/xsum_test_1000.jsonl runs/xsum/data

The files are written next to the runs, never into the project; an existing split is left as it is.
"""

import sys
from pathlib import Path

SPLITS = {"train": slice(0, 760), "dev": slice(760, 800), "test": slice(800, 1000)}


def main(source: str, target: str) -> None:
    out = Path(target)
    if all((out / f"{name}.jsonl").is_file() for name in SPLITS):
        return
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    if len(lines) != 1000:
        raise SystemExit(f"{source}: expected 1000 XSum rows, found {len(lines)}")
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in SPLITS.items():
        (out / f"{name}.jsonl").write_text("\n".join(lines[rows]) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
