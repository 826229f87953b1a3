"""Score a model on its task's test split under its skip schedule and densely, as one table (``skiptrain evaluate``).

Both columns come from ``trainer.test`` runs of the same module (the second one with a dense schedule): loss and
perplexity, the task's generation metrics (0-100, :mod:`skiptrain.training.metrics`), and the decode cost over
``model.generation.max_new_tokens`` generated tokens (:mod:`skiptrain.core.speedup`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info

from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.training.metrics import GENERATION_METRICS

if TYPE_CHECKING:
    import lightning as L

    from skiptrain.data.datamodule import SkipDataModule
    from skiptrain.training.module import SkipLM


def evaluation_table(scheduled: dict[str, float], dense: dict[str, float], schedule: SkipSchedule,
                     generation_length: int) -> dict[str, dict[str, float]]:
    """Metrics under the schedule and dense from two ``trainer.test`` runs (the second one with a dense schedule).

    Args:
        scheduled: ``test/*`` metrics of the run under the schedule (its ``loss_dense`` is the dense loss).
        dense: ``test/*`` metrics of the run with the dense schedule.
        schedule: The schedule.
        generation_length: Generated tokens over which mean executed layers and ideal speedup are taken.

    Returns:
        ``{"schedule": {metric: value}, "dense": {metric: value}}``.
    """
    table: dict[str, dict[str, float]] = {"schedule": {}, "dense": {}}
    for name, key in (("loss", "loss"), ("perplexity", "ppl")):
        if f"test/{key}_skip" in scheduled:
            table["schedule"][name] = scheduled[f"test/{key}_skip"]
            table["dense"][name] = scheduled[f"test/{key}_dense"]
    for name in GENERATION_METRICS:
        if f"test/{name}" in scheduled:
            table["schedule"][name] = scheduled[f"test/{name}"]
            table["dense"][name] = dense.get(f"test/{name}", float("nan"))
    for column, decoded in (("schedule", schedule), ("dense", Dense().build(schedule.num_layers))):
        table[column]["mean_layers_per_token"] = decoded.mean_layers_per_token(generation_length)
        table[column]["ideal_speedup"] = decoded.sequence_ideal_speedup(generation_length)
    return table


def format_table(table: dict[str, dict[str, float]]) -> str:
    """A Markdown table with one row per metric and one column per schedule."""
    columns = list(table)
    rows = ["| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for metric in table[columns[0]]:
        rows.append(f"| {metric} | " + " | ".join(f"{table[c].get(metric, float('nan')):.4f}" for c in columns) + " |")
    return "\n".join(rows)


def evaluate_against_dense(trainer: L.Trainer, module: SkipLM, datamodule: SkipDataModule,
                           output: str | None = None) -> dict[str, dict[str, float]]:
    """Test ``module`` under its schedule and densely, log the :func:`evaluation_table` and write it as JSON.

    Args:
        trainer: Runs ``test``.
        module: The module with its weights.
        datamodule: The task's data module (its test split is scored).
        output: Also write the table as JSON to this file (on global rank zero).
    """
    schedule = module.schedule
    scheduled = _floats(trainer.test(module, datamodule=datamodule, verbose=False))
    with module.scored_under(Dense().build(schedule.num_layers)):
        dense = _floats(trainer.test(module, datamodule=datamodule, verbose=False))
    length = module.generation.max_new_tokens
    table = evaluation_table(scheduled, dense, schedule, length)
    rank_zero_info(f"skiptrain evaluate ({datamodule.task}, test split), schedule {schedule.family} vs dense; "
                   f"mean_layers_per_token and ideal_speedup over {length} generated tokens "
                   f"(model.generation.max_new_tokens):\n" + format_table(table))
    if output and trainer.is_global_zero:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(table, indent=2) + "\n")
    return table


def _floats(results: list[dict[str, Any]]) -> dict[str, float]:
    return {k: float(v) for k, v in (results[0] if results else {}).items()}


__all__ = ["GENERATION_METRICS", "evaluate_against_dense", "evaluation_table", "format_table"]
