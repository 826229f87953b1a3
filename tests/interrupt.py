"""A test-only callback that crashes a run at the start of an epoch, as a killed job would stop."""

from lightning.pytorch.callbacks import Callback


class SimulatedCrash(RuntimeError):
    """Raised by :class:`CrashAtEpoch`."""


class CrashAtEpoch(Callback):
    """Raise :class:`SimulatedCrash` when epoch ``epoch`` starts (after the previous epoch's checkpoint)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise SimulatedCrash(f"simulated crash at the start of epoch {self.epoch}")
