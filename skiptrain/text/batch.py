"""The batch layout contract shared by training, evaluation and inference.

Every batch is LEFT-padded so that each row's prompt ends at the same column ``P`` (``prompt_length``, the
longest prompt in the batch); columns ``>= P`` hold the target tokens, right-padded to the longest target ``T``.
Column ``P + g`` holds the ``g``-th target token of every row. Plain language-model data has no prompt
(``P == 0``); prompts for generation have no target (``T == 0``).

Labels follow the Hugging Face convention: ``labels`` is aligned with ``input_ids`` (``labels[:, c] ==
input_ids[:, c]`` on supervised positions, :data:`IGNORE_INDEX` elsewhere) and the model/loss shifts internally,
i.e. the logits at column ``c - 1`` are scored against ``labels[:, c]``. With this layout the first target token
(column ``P``) is predicted from the last prompt token (column ``P - 1``).

This module has no dependency on the data pipeline (``datasets``, Lightning), so inference can import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100
"""Label value of positions that are not scored (pads, prompts without ``prompt_loss``)."""

PROMPT_IDS = "prompt_ids"
TARGET_IDS = "target_ids"
SOURCE = "source"
REFERENCES = "references"


def collate(examples: Sequence[Mapping[str, Any]], pad_token_id: int, prompt_loss: bool = False) -> dict[str, Any]:
    """Collate tokenised examples into a left/right padded batch.

    Each example has ``prompt_ids`` and ``target_ids`` (lists of ints) and optionally ``source`` (str) and
    ``references`` (list of str). Row ``i`` of ``input_ids`` is ``[pad..., prompt..., target..., pad...]`` with
    the prompt ending at column ``P = max prompt length`` and the target starting at column ``P``.

    Args:
        examples: The examples.
        pad_token_id: Id used for padding (may equal EOS: labels and masks never depend on the pad id).
        prompt_loss: Also put labels on prompt tokens (pads never get labels).

    Returns:
        A dict with
        ``input_ids`` (LongTensor ``[B, P + T]``),
        ``attention_mask`` (``[B, P + T]``, 0 on pads),
        ``labels`` (``[B, P + T]``, aligned with ``input_ids`` and ``-100`` except on target tokens, plus prompt
        tokens with ``prompt_loss``; the model shifts, so logits at column ``c - 1`` predict ``labels[:, c]``),
        ``prompt_length`` (int ``P``),
        ``prompt_input_ids`` / ``prompt_attention_mask`` (``[B, P]``, the left-padded prompts alone, for
        generation),
        and, when the examples carry them, ``sources`` (list of str) and ``references`` (list of list of str).

    Raises:
        ValueError: If ``examples`` is empty.
    """
    if not examples:
        raise ValueError("cannot collate an empty list of examples")
    prompts = [list(ex[PROMPT_IDS]) for ex in examples]
    targets = [list(ex[TARGET_IDS]) for ex in examples]
    batch_size = len(examples)
    prompt_len = max(len(p) for p in prompts)
    target_len = max(len(t) for t in targets)
    input_ids = torch.full((batch_size, prompt_len + target_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for i, (prompt, target) in enumerate(zip(prompts, targets, strict=True)):
        start = prompt_len - len(prompt)
        if prompt:
            input_ids[i, start:prompt_len] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[i, start:prompt_len] = 1
            if prompt_loss:
                labels[i, start:prompt_len] = input_ids[i, start:prompt_len]
        end = prompt_len + len(target)
        if target:
            input_ids[i, prompt_len:end] = torch.tensor(target, dtype=torch.long)
            attention_mask[i, prompt_len:end] = 1
            labels[i, prompt_len:end] = input_ids[i, prompt_len:end]
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "prompt_length": prompt_len,
        "prompt_input_ids": input_ids[:, :prompt_len].clone(),
        "prompt_attention_mask": attention_mask[:, :prompt_len].clone(),
    }
    if all(SOURCE in ex for ex in examples):
        batch["sources"] = [str(ex[SOURCE]) for ex in examples]
    if all(REFERENCES in ex for ex in examples):
        batch["references"] = [list(ex[REFERENCES]) for ex in examples]
    return batch


def collate_prompts(prompt_ids: Sequence[Sequence[int]], pad_token_id: int) -> dict[str, Any]:
    """A batch of prompts alone, for generation: :func:`collate` with empty targets (``T == 0``).

    Its ``prompt_input_ids`` / ``prompt_attention_mask`` are what a training or evaluation batch of the same
    prompts holds: left-padded, every prompt ending at column ``P``.
    """
    return collate([{PROMPT_IDS: list(ids), TARGET_IDS: []} for ids in prompt_ids], pad_token_id)


@dataclass(frozen=True)
class Collator:
    """Picklable wrapper around :func:`collate` for ``DataLoader(collate_fn=...)``.

    Attributes:
        pad_token_id: Padding id.
        prompt_loss: Also supervise prompt tokens.
    """

    pad_token_id: int
    prompt_loss: bool = False

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate ``examples``; see :func:`collate`."""
        return collate(examples, self.pad_token_id, self.prompt_loss)


__all__ = ["IGNORE_INDEX", "PROMPT_IDS", "REFERENCES", "SOURCE", "TARGET_IDS", "Collator", "collate", "collate_prompts"]
