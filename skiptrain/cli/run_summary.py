"""What a fit run says before its progress bar: the model's parameters, the precision, where logs and checkpoints go.

It replaces Lightning's model summary table, whose ``FLOPs`` column reads 0 for a model that is built in
``configure_model``. The model and its schedule (mean executed layers, ideal speedup) are said by
:meth:`~skiptrain.training.module.SkipLM.configure_model` as it builds them.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_summary import get_human_readable_count


def _numel(parameter: torch.nn.Parameter) -> int:
    return getattr(parameter, "ds_numel", parameter.numel())  # DeepSpeed ZeRO-3 holds a shard: ds_numel is the whole


def summary_lines(trainer: L.Trainer, module: L.LightningModule) -> list[str]:
    """The run's facts, one line each: parameters (total, trainable, weight dtype), precision, logs and checkpoints."""
    parameters = list(module.parameters())
    total = sum(_numel(p) for p in parameters)
    trainable = sum(_numel(p) for p in parameters if p.requires_grad)
    frozen = [p.dtype for p in parameters if not p.requires_grad] or [p.dtype for p in parameters]
    dtype = str(frozen[0]).removeprefix("torch.") if frozen else "none"
    lines = [f"skiptrain: {get_human_readable_count(total)} parameters ({dtype} weights), "
             f"{get_human_readable_count(trainable)} trainable ({100 * trainable / max(total, 1):.2f}%)",
             f"skiptrain: precision {trainer.precision} on {trainer.strategy.root_device}"]
    where = f"skiptrain: logs in {trainer.log_dir}" if trainer.log_dir else "skiptrain: no logger"
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and getattr(checkpoint, "dirpath", None):
        where += f", checkpoints in {checkpoint.dirpath}"
    return [*lines, where]


class RunSummary(ModelSummary):
    """Lightning's model summary callback, saying :func:`summary_lines` instead of the table."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            for line in summary_lines(trainer, pl_module):
                rank_zero_info(line)
