"""The order of the training batches, and where a resumed run picks it up.

Each epoch draws one permutation seeded by ``seed + epoch`` (:class:`EpochShuffleSampler`), so the order depends
only on the epoch number. A checkpoint records how far training got (:class:`TrainingPosition`, kept in the data
module's state), and a run resumed from it starts that epoch's permutation where the stopped run left it
(:class:`ResumingLoader`): every batch of the epoch is trained once, whether or not the run was stopped in between.

Why not torchdata's ``StatefulDataLoader``, whose state Lightning saves and restores: with it, the preempted fit of
``tests/test_faults.py`` resumes on another batch than the uninterrupted run (Lightning 2.6, torchdata 0.11). The
module asks for ``trainer.estimated_stepping_batches`` (the learning-rate schedule), which builds the training loader
before Lightning loads the loader's state, so the state is never loaded and the epoch starts again (Lightning issue
#20550). Without that call the loader skips the trained batches, but of the wrong order: its iterator is made
before Lightning sets the sampler's epoch, so it replays the first epoch's permutation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader


class EpochShuffleSampler(torch.utils.data.Sampler[int]):
    """A permutation seeded by ``seed + epoch``.

    Lightning calls ``set_epoch`` before every epoch after the first; a run resumed in epoch ``epoch`` starts with
    it, since its first batch is drawn before Lightning sets it (under DDP Lightning wraps this sampler in a
    ``DistributedSampler`` seeded per epoch the same way).
    """

    def __init__(self, size: int, seed: int = 0, epoch: int = 0) -> None:
        self.size, self.seed, self.epoch = size, seed, epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


@dataclasses.dataclass(frozen=True)
class TrainingPosition:
    """How far training got: the epoch in progress and how many of its batches were trained."""

    epoch: int = 0
    batches: int = 0

    @classmethod
    def of(cls, trainer: L.Trainer) -> TrainingPosition:
        """The position of a fitting trainer: Lightning's progress counters (the epoch counter Lightning seeds the
        sampler with; after an epoch's last batch, the next epoch at batch 0)."""
        loop = trainer.fit_loop
        batches = loop.epoch_loop.batch_progress.current.processed
        if batches >= trainer.num_training_batches:
            batches = 0
        return cls(loop.epoch_progress.current.processed, batches)

    def state_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> TrainingPosition:
        return cls(int(state.get("epoch", 0)), int(state.get("batches", 0)))


class ResumingLoader(DataLoader):
    """A ``DataLoader`` whose first pass leaves out the ``skip_batches`` batches a stopped run already trained.

    Later passes (epochs) are whole. The skipped batches are drawn and dropped, so the sampler's order and any
    worker state advance exactly as in an uninterrupted run.
    """

    def __init__(self, *args: Any, skip_batches: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skip_batches = skip_batches

    def __iter__(self):
        iterator = super().__iter__()
        skip, self.skip_batches = self.skip_batches, 0
        for _ in range(skip):
            next(iterator)
        return iterator


__all__ = ["EpochShuffleSampler", "ResumingLoader", "TrainingPosition"]
