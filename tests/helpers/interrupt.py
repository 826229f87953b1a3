"""Test-only callbacks that stop a run the ways real jobs stop: an exception, a signal, a failed checkpoint write."""

import os
import signal

from fsspec.implementations.local import LocalFileOpener
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


class SignalAtStep(Callback):
    """Send this process ``signal`` (a name: ``SIGKILL``, ``SIGTERM``) when training step ``step`` starts."""

    def __init__(self, step: int, signal: str) -> None:
        self.step = step
        self.signal = signal

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), getattr(signal, self.signal))


class DiskFull(OSError):
    """Raised by :class:`FailLastCheckpointWrite` halfway through writing a checkpoint."""


class FailLastCheckpointWrite(Callback):
    """From epoch ``epoch`` on, a write of ``last.ckpt`` stops halfway with :class:`DiskFull`, as on a full disk."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch < self.epoch or getattr(LocalFileOpener.write, "fails", False):
            return
        write = LocalFileOpener.write

        def half_then_fail(opened, data):
            if not str(opened.path).endswith("last.ckpt"):
                return write(opened, data)
            write(opened, bytes(data)[: len(data) // 2])
            raise DiskFull("no space left on device (simulated, halfway through last.ckpt)")

        half_then_fail.fails = True
        LocalFileOpener.write = half_then_fail
        self._restore = write

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.teardown(trainer, pl_module, "fit")  # Lightning does not tear callbacks down after an exception

    def teardown(self, trainer, pl_module, stage) -> None:
        if hasattr(self, "_restore"):
            LocalFileOpener.write = self._restore
            del self._restore
