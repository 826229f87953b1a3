"""Command-line arguments of a tiny CLI run, and reading what it logged."""

from __future__ import annotations

import csv
from pathlib import Path


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    """The rows of the newest ``metrics.csv`` under ``run_dir``."""
    files = sorted(run_dir.rglob("metrics.csv"))
    assert files, f"no metrics.csv under {run_dir}"
    with files[-1].open() as f:
        return list(csv.DictReader(f))


def tiny_args(model_dir: str, run_dir: Path, *extra: str) -> list[str]:
    """Options of a fast CPU run of ``model_dir`` (a SkipDecode schedule, small batches, CSV logs in ``run_dir``)."""
    return [
        "--model.model", model_dir,
        "--model.schedule", "SkipDecode",
        "--model.schedule.min_layers", "2",
        "--model.schedule.decay_tokens", "6",
        "--model.generation.max_new_tokens", "6",
        "--data.batch_size", "4",
        "--data.max_eval_samples", "8",
        "--data.max_source_tokens", "48",
        "--data.max_target_tokens", "24",
        "--trainer.accelerator", "cpu",
        "--trainer.enable_model_summary", "false",
        "--trainer.default_root_dir", str(run_dir),
        "--trainer.logger", "CSVLogger",
        "--trainer.logger.save_dir", str(run_dir),
        *extra,
    ]
