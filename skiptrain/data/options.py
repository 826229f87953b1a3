"""The data module's options in groups that check themselves: lengths, batches, splits.

Users still write them flat (``data.batch_size``, ``data.max_source_tokens``, ...); the data module gathers them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from skiptrain.errors import UsageError
from skiptrain.text.tasks import TaskSpec

Role = Literal["train", "val", "test"]

PACKING_REFUSED = (
    "packing=true is refused: the skip-aware forward runs each layer on one prefix of columns shared by the whole "
    "batch (one depth per column), so a second example packed after a first could neither have its prompt at full "
    "depth nor restart its generated index at its own target; leave data.packing false (batches are left-padded so "
    "that every target starts at one column)"
)


def _at_least_one(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise UsageError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class Lengths:
    """Token limits: the prompt (its source trimmed), the target (before EOS), a block of plain text."""

    max_source_tokens: int = 768
    max_target_tokens: int = 128
    block_size: int = 512

    def __post_init__(self) -> None:
        _at_least_one(max_source_tokens=self.max_source_tokens, max_target_tokens=self.max_target_tokens,
                      block_size=self.block_size)

    def limit(self, language_modeling: bool) -> tuple[str, int]:
        """The limits an example is held to, as words, and the longest example they allow, in tokens."""
        if language_modeling:
            return f"block_size={self.block_size}", self.block_size
        return (f"max_source_tokens={self.max_source_tokens} + max_target_tokens={self.max_target_tokens} + 1 (EOS)",
                self.max_source_tokens + self.max_target_tokens + 1)


@dataclass(frozen=True)
class Batching:
    """How examples are batched: sizes, loader workers, and packing (refused, :data:`PACKING_REFUSED`)."""

    batch_size: int = 8
    eval_batch_size: int | None = None
    num_workers: int = 0
    packing: bool = False

    def __post_init__(self) -> None:
        _at_least_one(batch_size=self.batch_size)
        if self.eval_batch_size is not None:
            _at_least_one(eval_batch_size=self.eval_batch_size)
        if self.packing:
            raise UsageError(PACKING_REFUSED)

    @property
    def eval_size(self) -> int:
        """The validation/test/predict batch size."""
        return self.eval_batch_size or self.batch_size


@dataclass(frozen=True)
class Splits:
    """Which splits are read, how many of their examples are kept, and the share of training rows held out for
    validation when the data has no validation split."""

    train: str
    val: str
    test: str
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    val_share: float = 0.05

    def __post_init__(self) -> None:
        if not 0 <= self.val_share < 1:
            raise UsageError(f"val_share={self.val_share} is invalid: allowed 0 <= val_share < 1 (0 holds out none)")

    @classmethod
    def of(cls, spec: TaskSpec, train: str | None, val: str | None, test: str | None, max_train_samples: int | None,
           max_eval_samples: int | None, val_share: float) -> Splits:
        """The splits named, or the task's defaults."""
        return cls(train or spec.train_split, val or spec.val_split, test or spec.test_split, max_train_samples,
                   max_eval_samples, val_share)

    def name(self, role: Role) -> str:
        """The split name of a role."""
        return {"train": self.train, "val": self.val, "test": self.test}[role]


__all__ = ["PACKING_REFUSED", "Batching", "Lengths", "Role", "Splits"]
