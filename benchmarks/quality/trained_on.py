"""Record what a study run trains in and on, beside the run, as each attempt starts (benchmarks/quality/study.sh):

    python -m benchmarks.quality.trained_on RUN_DIR --config BASE.yaml --config SCHEDULE.yaml [--config LEVER.yaml ...]

``RUN_DIR/trained_on.json`` holds the precision the run's trainer resolves and the machine of each attempt. The study
bases say ``precision: auto``, which is bf16-mixed only where bf16 is native, so the same command trains in another
precision on another CPU; study_report.py keeps this record with the run's training summary, and the tables never
pool seeds or take a share across precisions. A stopped run resumes only in the precision it started in: otherwise
this exits 2 with one line naming both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RECORD = "trained_on.json"


def resolved_precision(configs: list[str]) -> str:
    """The precision Lightning trains in under ``configs`` on this machine (``auto`` resolved)."""
    from benchmarks.common.study import study_config

    return str(study_config(configs).trainer.precision)


def record_attempt(run_dir: Path, precision: str, machine: dict) -> str | None:
    """Add this attempt to ``run_dir``'s record; the refusal to say when the run started in another precision."""
    path = run_dir / RECORD
    record = json.loads(path.read_text()) if path.is_file() else {"precision": precision, "machines": []}
    if record["precision"] != precision:
        return (f"{run_dir} started in {record['precision']} and would resume in {precision} on this machine: one run "
                f"trains in one precision (resume it where it started, or give it a precision lever such as fp32)")
    record["machines"].append(machine)
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--config", action="append", required=True, help="the run's configs, in order")
    args = parser.parse_args()
    from benchmarks.common.machine import describe

    refusal = record_attempt(args.run_dir, resolved_precision(args.config), describe())
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
