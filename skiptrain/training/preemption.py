"""A checkpoint when the job is asked to stop: SIGTERM, which cluster schedulers send before preempting a job.

Lightning turns SIGTERM into a ``SIGTERMException`` after the current training step and calls ``on_exception``
hooks; :class:`PreemptionCheckpoint` saves ``last.ckpt`` there, so ``fit --ckpt_path .../last.ckpt`` resumes the
run from the step it reached, and makes the process exit with status 143 (128 + SIGTERM, a shell's status for a
process SIGTERM ended): Lightning's exception would exit 0, and a wrapper (``fit && export``, a study driver, a
scheduler's epilogue) would take the stopped run for a finished one. The CLI adds it to every run. Lightning writes
checkpoints atomically (to a temporary file renamed into place), so a write cut short leaves the previous
``last.ckpt`` as it was.
"""

from __future__ import annotations

import signal
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

STOPPED_BY_SIGTERM = 128 + signal.SIGTERM


class PreemptionCheckpoint(Callback):
    """Save ``last.ckpt`` (beside the run's other checkpoints) when fit stops on SIGTERM, and exit with 143."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        exception.code = STOPPED_BY_SIGTERM  # a SystemExit: the process's exit status once it propagates
        if not trainer.training:
            return
        path = checkpoint_dir(trainer) / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
        trainer.save_checkpoint(path)
        rank_zero_info(f"skiptrain: SIGTERM at step {trainer.global_step}: saved {path}; resume with --ckpt_path")


def checkpoint_dir(trainer: L.Trainer) -> Path:
    """Where the run's ``ModelCheckpoint`` writes, else ``<log_dir>/checkpoints`` as Lightning's default would."""
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint) and callback.dirpath:
        return Path(callback.dirpath)
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"


__all__ = ["STOPPED_BY_SIGTERM", "PreemptionCheckpoint", "checkpoint_dir"]
