"""Split a data file by row ranges into named files of the same format (CSV or JSON lines), outside the project.

    python benchmarks/quality/split_rows.py ../shared/data/xsum/xsum_test_1000.jsonl runs/xsum/data \
        --rows 1000 train=0:760 dev=760:800 test=800:1000

Each ``NAME=START:STOP`` writes rows ``START`` to ``STOP - 1`` (0-based, in file order) to ``TARGET/NAME.EXT``. CSV
rows are parsed, so quoted fields may span lines, and written back with the source's header. ``--rows`` is the row
count the source must have. A split whose files all exist is left as it is.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

from skiptrain.core.output_dir import write_whole


def read_rows(path: Path) -> tuple[list[str] | None, list]:
    """``(header, rows)``: CSV rows as lists of fields under their header, JSON lines as lines (no header)."""
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader)
            return header, list(reader)
    return None, path.read_text(encoding="utf-8").splitlines()


def write_rows(path: Path, header: list[str] | None, rows: list) -> None:
    """Write rows as :func:`read_rows` read them, all or nothing (:func:`write_whole`)."""
    if header is None:
        write_whole(path, "\n".join(rows) + "\n")
        return
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_whole(path, text.getvalue())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--rows", type=int, required=True, help="the row count the source must have")
    parser.add_argument("splits", nargs="+", metavar="NAME=START:STOP")
    args = parser.parse_args(argv)
    splits = {}
    for spec in args.splits:
        name, _, span = spec.partition("=")
        start, _, stop = span.partition(":")
        if not (name and start.isdigit() and stop.isdigit() and int(start) < int(stop) <= args.rows):
            sys.exit(f"split {spec!r} is invalid: allowed NAME=START:STOP with 0 <= START < STOP <= {args.rows}")
        splits[name] = slice(int(start), int(stop))
    files = {name: args.target / f"{name}{args.source.suffix}" for name in splits}
    if all(path.is_file() for path in files.values()):
        return
    header, rows = read_rows(args.source)
    if len(rows) != args.rows:
        sys.exit(f"{args.source}: expected {args.rows} rows, found {len(rows)}")
    args.target.mkdir(parents=True, exist_ok=True)
    for name, rows_of_split in splits.items():
        write_rows(files[name], header, rows[rows_of_split])


if __name__ == "__main__":
    main()
