"""Export the fine-tuned model with its skip schedule when ``fit`` ends (``skiptrain.callbacks.export``).

Add it to a recipe::

    trainer:
      callbacks:
        - class_path: skiptrain.callbacks.export.ExportCallback
          init_args:
            output_dir: runs/opt1.3b_e2e/export
            which: best     # the checkpoint ModelCheckpoint(monitor=...) chose; or last
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from skiptrain.core.output_dir import check_output_dir
from skiptrain.export.record import ExportRecord, Which
from skiptrain.training.checkpoints import consolidate_checkpoint
from skiptrain.training.module import SkipLM
from skiptrain.training.runs import best_checkpoint, export_module, fit_record


class ExportCallback(Callback):
    """Write an export (Hugging Face model + ``skip_schedule.json``, see :mod:`skiptrain.export`) at the end of fit.

    Runs on global rank zero only, after Lightning has moved the model to the CPU. The trained model is left as it
    was (LoRA adapters are merged into a copy), so ``trainer.test`` can follow. Nothing is exported when fit was
    interrupted or failed. The output directory is checked when fit starts, so a refused target fails before
    training rather than after it. The record and model card say which weights were exported, at which step and,
    for the best checkpoint, with which score.

    Args:
        output_dir: Directory to write; must be absent or empty unless ``overwrite``.
        adapter_only: Save only the LoRA adapter (and ``skip_schedule.json`` naming the base model).
        overwrite: Replace a non-empty ``output_dir`` (only once the new export is complete and checked).
        which: ``best``: the weights of the checkpoint that a ``ModelCheckpoint(monitor=...)`` kept as best (the
            last weights when no callback monitors a metric); ``last``: the weights fit ended with.
    """

    def __init__(self, output_dir: str, adapter_only: bool = False, overwrite: bool = False,
                 which: Which = "best") -> None:
        self.output_dir = output_dir
        self.adapter_only = adapter_only
        self.overwrite = overwrite
        self.which = which

    def check_target(self) -> None:
        """Refuse a target that exists and is not empty (unless ``overwrite``): the CLI calls it before a fit reads
        any data, and the fit's start checks again."""
        check_output_dir(self.output_dir, self.overwrite)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.check_target()

    def on_fit_end(self, trainer: L.Trainer, pl_module: SkipLM) -> None:
        if not trainer.is_global_zero:
            return
        if trainer.interrupted:
            rank_zero_warn(f"fit was interrupted: nothing exported to {self.output_dir}")
            return
        best = best_checkpoint(trainer) if self.which == "best" else None
        if best is None:
            if self.which == "best":
                rank_zero_info("skiptrain: no ModelCheckpoint(monitor=...) kept a best checkpoint: exporting the "
                               "last weights")
            self._export(pl_module, fit_record(trainer, pl_module))
            return
        last = {name: tensor.detach().clone() for name, tensor in pl_module.state_dict().items()}
        pl_module.load_state_dict(consolidate_checkpoint(best[0], reference=pl_module))
        try:
            self._export(pl_module, fit_record(trainer, pl_module, best))
        finally:
            pl_module.load_state_dict(last)  # the module keeps the weights fit ended with

    def _export(self, module: SkipLM, record: ExportRecord) -> None:
        export_module(module, self.output_dir, record, adapter_only=self.adapter_only, overwrite=self.overwrite)

