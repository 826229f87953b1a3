"""Lightning callbacks that tests name in CLI configs."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback


class RecordSchedules(Callback):
    """Records the schedule each training step trains with."""

    def __init__(self) -> None:
        self.schedules = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.schedules.append(pl_module.training_schedule())
