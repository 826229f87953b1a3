"""The progress bar of skiptrain's command line.

Lightning's rich bar labels the epoch ``Epoch {current}/{max_epochs - 1}``; a run bounded by ``max_steps`` has
``max_epochs=-1`` (no epoch limit), which that label turns into ``Epoch 0/-2``. This bar leaves the total out
when there is no epoch limit; the step count beside it is the run's bound. It shows the run's metrics (loss,
tokens/s) without Lightning's ``v_num`` (the logger's version number, which reads ``0.000``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """Lightning's ``RichProgressBar``, labelled ``Epoch N`` (no total) when ``max_epochs`` sets no limit, without
    ``v_num``."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 1:
            return super()._get_train_description(current_epoch)
        return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
