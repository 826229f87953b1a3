"""The draft vocabulary of lossless speculative decoding: the most frequent target tokens of the training data.

The tokens counted are those the loss is computed on (the ``labels`` of the training batches), so the draft's head
keeps the rows of the tokens the fine-tuned model was trained to produce (``skiptrain export --draft_vocab_size N``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader

from skiptrain.core import log
from skiptrain.errors import UsageError
from skiptrain.text.batch import IGNORE_INDEX

if TYPE_CHECKING:
    from skiptrain.data.datamodule import SkipDataModule

COUNTING_BATCH = 256


def check_draft_vocab_size(size: int, vocab_size: int | None = None) -> None:
    """Refuse a draft vocabulary size outside ``1..vocab_size``.

    Raises:
        UsageError: naming ``draft_vocab_size`` and the allowed range.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or vocab_size is not None and size > vocab_size:
        limit = "the vocabulary size" if vocab_size is None else vocab_size
        raise UsageError(f"draft_vocab_size={size!r} is invalid: allowed 1 <= draft_vocab_size <= {limit} token ids "
                         "(null records no draft vocabulary)")


def target_token_counts(datamodule: SkipDataModule, vocab_size: int) -> torch.Tensor:
    """``[vocab_size]`` how often each token id is a training target (a label the loss scores)."""
    datamodule.setup("fit")
    loader = DataLoader(datamodule.datasets["train"], batch_size=COUNTING_BATCH, collate_fn=datamodule.collator())
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for batch in loader:
        labels = batch["labels"]
        counts += torch.bincount(labels[labels != IGNORE_INDEX].flatten(), minlength=vocab_size)[:vocab_size]
    return counts


def frequent_target_tokens(datamodule: SkipDataModule, size: int, vocab_size: int) -> tuple[int, ...]:
    """The ``size`` most frequent target token ids of the training split, most frequent first (ties: lower id).

    Raises:
        UsageError: for ``size`` outside ``1..vocab_size``.
    """
    check_draft_vocab_size(size, vocab_size)
    counts = target_token_counts(datamodule, vocab_size)
    order = torch.sort(counts, descending=True, stable=True).indices[:size]  # ties keep the lower id first
    covered = float(counts[order].sum()) / max(int(counts.sum()), 1)
    log.info(f"skiptrain: draft vocabulary of {size} token ids covers {covered:.1%} of the training targets")
    return tuple(order.tolist())


__all__ = ["check_draft_vocab_size", "frequent_target_tokens", "target_token_counts"]
