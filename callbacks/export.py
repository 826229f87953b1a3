"""Export the fine-tuned model with its skip schedule when ``fit`` ends (``skiptrain.callbacks.export``).

Add it to a recipe::

    trainer:
      callbacks:
        - class_path: skiptrain.callbacks.export.ExportCallback
          init_args:
            output_dir: runs/opt1.3b_e2e/export
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from skiptrain.export import (
    RUN_CONFIG_FILE,
    VALIDATION_PREFIX,
    ExportInfo,
    check_target,
    export_module,
    hyperparameters_yaml,
)
from skiptrain.module import SkipLM


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

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            check_target(self.output_dir, self.overwrite)

    def on_fit_end(self, trainer: L.Trainer, pl_module: SkipLM) -> None:
        if not trainer.is_global_zero:
            return
        if trainer.interrupted:
            rank_zero_warn(f"fit was interrupted: nothing exported to {self.output_dir}")
            return
        export_module(pl_module, self.output_dir, run_info(trainer, pl_module), adapter_only=self.adapter_only,
                      overwrite=self.overwrite)


def run_info(trainer: L.Trainer, pl_module: SkipLM) -> ExportInfo:
    """What the export records about a run that just finished fitting."""
    datamodule = getattr(trainer, "datamodule", None)
    config_file = Path(trainer.log_dir or trainer.default_root_dir) / RUN_CONFIG_FILE
    training_config = (config_file.read_text() if config_file.is_file() else
                       hyperparameters_yaml(pl_module.hparams, datamodule.hparams if datamodule is not None else None))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(VALIDATION_PREFIX)}
    return ExportInfo(
        base_model=pl_module.model_name,
        trained_with_schedule=trainer.global_step > 0,
        task=getattr(datamodule, "task", None),
        training_config=training_config,
        metrics=metrics,
        metrics_source="the run's last validation (trainer.callback_metrics at the end of fit)",
    )
