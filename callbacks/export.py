"""Export the fine-tuned model with its skip schedule when ``fit`` ends (``skiptrain.callbacks.export``).

Add it to a recipe::

    trainer:
      callbacks:
        - class_path: skiptrain.callbacks.export.ExportCallback
          init_args:
            output_dir: runs/opt1.3b_e2e/export
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from skiptrain.core.output_dir import check_output_dir
from skiptrain.training.module import SkipLM
from skiptrain.training.runs import export_module, fit_record


class ExportCallback(Callback):
    """Write an export (Hugging Face model + ``skip_schedule.json``, see :mod:`skiptrain.export`) at the end of fit.

    Runs on global rank zero only, after Lightning has moved the model to the CPU. The trained model is left as it
    was (LoRA adapters are merged into a copy), so ``trainer.test`` can follow. Nothing is exported when fit was
    interrupted or failed. The output directory is checked when fit starts, so a refused target fails before
    training rather than after it.

    Args:
        output_dir: Directory to write; must be absent or empty unless ``overwrite``.
        adapter_only: Save only the LoRA adapter (and ``skip_schedule.json`` naming the base model).
        overwrite: Replace a non-empty ``output_dir`` (only once the new export is complete and checked).
    """

    def __init__(self, output_dir: str, adapter_only: bool = False, overwrite: bool = False) -> None:
        self.output_dir = output_dir
        self.adapter_only = adapter_only
        self.overwrite = overwrite

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
        export_module(pl_module, self.output_dir, fit_record(trainer, pl_module), adapter_only=self.adapter_only,
                      overwrite=self.overwrite)

