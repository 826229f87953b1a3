"""Write a :class:`~skiptrain.training.calibrate.Calibration` to one directory, all or nothing.

``output_dir`` receives:

- ``candidates.json``, ``candidates.csv``, ``candidates.md``: every scored candidate (family, parameters, loss,
  perplexity, mean executed layers, ideal speedup, whether it is on the Pareto front, generation metrics);
- ``importance.json`` and ``importance.png``: the layer importance profile and the ranking taken from it;
- ``pareto.png``: loss against ideal speedup, every candidate by family, the Pareto front as a line;
- ``schedule_<T>x.yaml`` for each target ``T``: the lowest-loss schedule reaching it, as a recipe fragment
  (``model.schedule``) with its measured numbers in the header, and ``schedule_<T>x_<family>.yaml``, the best of
  each family;
- ``summary.json``: the setting (layers, validation tokens, dense loss, targets) and the chosen schedules.

The plots need matplotlib (``pip install skiptrain[bench]``).
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from skiptrain.core.candidates import Candidate
from skiptrain.core.output_dir import check_output_dir, staged_directory
from skiptrain.core.schedules import FAMILIES
from skiptrain.errors import UsageError
from skiptrain.training.calibrate import Calibration

COLUMNS = ("family", "loss", "perplexity", "mean_layers", "ideal_speedup", "pareto", "params")


def require_matplotlib() -> None:
    """Refuse early (before any measuring) when the plots cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise UsageError("skiptrain calibrate draws its plots with matplotlib, which is not installed: "
                         "pip install 'skiptrain[bench]'") from err


def fragment(candidate: Candidate, calibration: Calibration, target: float | None = None) -> str:
    """A recipe fragment (``model.schedule``) for ``candidate``, its measured numbers in the header."""
    tokens = sum(calibration.lengths)
    header = [
        f"# skiptrain calibrate: {candidate.name} schedule"
        + (f", the lowest validation loss reaching an ideal decode speedup of {target:g}x" if target else ""),
        f"# validation loss {candidate.loss:.4f} (perplexity {candidate.perplexity:.3f}); dense "
        f"{calibration.dense_loss:.4f} (perplexity {math.exp(calibration.dense_loss):.3f})",
        f"# {candidate.mean_layers:.2f} of {calibration.num_layers} decoder layers per generated token, ideal decode "
        f"speedup {candidate.ideal_speedup:.2f}x over the {tokens} target tokens of {len(calibration.lengths)} "
        "validation examples",
        *(f"# {k}: {v:.4f} (greedy, validation subset)" for k, v in candidate.generation.items()),
    ]
    schedule = {"class_path": f"skiptrain.{FAMILIES[candidate.name].__name__}", "init_args": candidate.family.params()}
    body = yaml.safe_dump({"model": {"schedule": schedule}}, sort_keys=False, default_flow_style=None, width=120)
    return "\n".join(header) + "\n" + body


def rows(calibration: Calibration) -> list[dict[str, Any]]:
    """Every candidate as a table row, with whether it is on the Pareto front."""
    front = set(map(id, calibration.front))
    return [{**c.row(), "pareto": id(c) in front} for c in calibration.candidates]


def markdown_table(table: list[dict[str, Any]]) -> str:
    """The candidates as a Markdown table, lowest loss first."""
    extra = sorted({k for row in table for k in row} - set(COLUMNS))
    header = [c for c in COLUMNS if c != "params"] + extra + ["params"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in sorted(table, key=lambda r: r["loss"]):
        cells = [_cell(row.get(k, "")) for k in header]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items() if k != "ranking")
    return str(value)


def plot_pareto(calibration: Calibration, path: Path) -> None:
    """Loss against ideal speedup: every candidate by family, the front as a line, the targets as dashes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(c.name for c in calibration.candidates):
        members = [c for c in calibration.candidates if c.name == name]
        axes.scatter([c.ideal_speedup for c in members], [c.loss for c in members], s=18, label=name)
    front = calibration.front
    axes.plot([c.ideal_speedup for c in front], [c.loss for c in front], color="black", linewidth=1,
              label="Pareto front")
    for target in calibration.targets:
        axes.axvline(target, color="grey", linestyle="--", linewidth=0.7)
    axes.set_xlabel(f"ideal decode speedup over the validation targets ({sum(calibration.lengths)} tokens)")
    axes.set_ylabel("teacher-forced validation loss")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_importance(calibration: Calibration, path: Path) -> None:
    """Per layer: the loss increase when it alone is skipped, and its input/output cosine similarity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profile = calibration.profile
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    top.bar([p.layer for p in profile], [p.loss_increase or 0.0 for p in profile], color="tab:red")
    top.set_ylabel("loss increase\n(layer skipped)")
    bottom.plot([p.layer for p in profile], [p.cosine for p in profile], marker="o", markersize=3)
    bottom.set_ylabel("cos(input, output)")
    bottom.set_xlabel("decoder layer (layer 0 always runs)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_calibration(calibration: Calibration, output_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write every output of a calibration into ``output_dir`` (absent or empty unless ``overwrite``), atomically.

    Returns:
        The output directory.
    """
    target = check_output_dir(output_dir, overwrite)
    table = rows(calibration)
    chosen: dict[str, dict[str, Any]] = {}
    with staged_directory(target, overwrite) as staging:
        (staging / "candidates.json").write_text(json.dumps(table, indent=2) + "\n")
        with (staging / "candidates.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([*COLUMNS[:-1], "generation", "params"])
            for row in table:
                generation = {k: v for k, v in row.items() if k not in COLUMNS}
                writer.writerow([row[k] for k in COLUMNS[:-1]] + [json.dumps(generation), json.dumps(row["params"])])
        (staging / "candidates.md").write_text(markdown_table(table))
        importance = {"ranking": calibration.ranking, "dense_loss": calibration.dense_loss,
                      "layers": [asdict(p) for p in calibration.profile]}
        (staging / "importance.json").write_text(json.dumps(importance, indent=2) + "\n")
        plot_importance(calibration, staging / "importance.png")
        plot_pareto(calibration, staging / "pareto.png")
        for goal in calibration.targets:
            label = f"{goal:g}x"
            best = calibration.best(goal)
            chosen[label] = {"best": best.row() if best else None, "per_family": {}}
            if best is not None:
                (staging / f"schedule_{label}.yaml").write_text(fragment(best, calibration, goal))
            for name in dict.fromkeys(c.name for c in calibration.candidates if c.name != "dense"):
                best_of = calibration.best(goal, name)
                chosen[label]["per_family"][name] = best_of.row() if best_of else None
                if best_of is not None:
                    (staging / f"schedule_{label}_{name}.yaml").write_text(fragment(best_of, calibration, goal))
        summary = {"num_layers": calibration.num_layers, "validation_examples": len(calibration.lengths),
                   "validation_target_tokens": sum(calibration.lengths), "dense_loss": calibration.dense_loss,
                   "targets": chosen}
        (staging / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return target


__all__ = ["fragment", "markdown_table", "require_matplotlib", "rows", "write_calibration"]
