"""The two draft levers of lossless speculative decoding: a pruned draft vocabulary and a confidence threshold.

A draft only proposes tokens that full depth then judges, so it may score fewer of them. :class:`DraftHead` scores
only the LM-head rows of a draft vocabulary (e.g. the N most frequent target tokens of the training data), and fills
every other token's logit with ``-inf``: greedy drafts are the argmax within the vocabulary, sampled drafts come
from the softmax over it (zero elsewhere), so the rejection rule stays exact. Verification keeps the full head.

An export records its draft vocabulary as ``draft_vocab.json`` (token ids, most frequent first) and its size under
``draft_vocab_size`` in ``skip_schedule.json`` (mirrored in ``config.json``); :func:`recorded_draft_vocab` reads it
for the export's ``generate(speculative_tokens=K)``.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from .schedule import CONFIG_KEY, SkipScheduleError

DRAFT_VOCAB_FILE = "draft_vocab.json"
DRAFT_VOCAB_SIZE_KEY = "draft_vocab_size"


def draft_vocab_problem(ids: Any, vocab_size: int) -> str | None:
    """Why ``ids`` (a list or 1-D tensor) is not a draft vocabulary of a ``vocab_size`` head, or ``None``."""
    values = ids.tolist() if isinstance(ids, torch.Tensor) and ids.dim() == 1 and not ids.is_floating_point() \
        else ids
    if not isinstance(values, list) or not values or not all(type(i) is int for i in values):
        return "allowed a non-empty list (1-D LongTensor) of token ids"
    if not all(0 <= i < vocab_size for i in values) or len(set(values)) != len(values):
        return f"allowed distinct token ids in [0, {vocab_size})"
    return None


def draft_confidence_problem(confidence: Any) -> str | None:
    """Why ``confidence`` is not a draft-confidence threshold, or ``None``."""
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 <= confidence < 1:
        return "allowed 0 <= draft_confidence < 1 (0 turns it off)"
    return None


class DraftHead:
    """The LM head over a draft vocabulary: ``[B, H]`` hidden states to ``[B, V]`` float32 logits, ``-inf`` outside.

    The head's rows (and bias) of the vocabulary are copied once; the model's final logit soft-capping (Gemma 2/3)
    applies as in its own head.

    Args:
        lm_head: The model's LM head (a linear layer over the full vocabulary).
        ids: ``[N]`` token ids of the draft vocabulary.
        config: The model's config (``final_logit_softcapping``).
    """

    def __init__(self, lm_head: nn.Module, ids: torch.Tensor, config: Any) -> None:
        weight = lm_head.weight
        self.ids = ids.to(device=weight.device, dtype=torch.long)
        self.weight = weight.detach()[self.ids]  # [N, H], a copy
        bias = getattr(lm_head, "bias", None)
        self.bias = None if bias is None else bias.detach()[self.ids]
        self.vocab_size = weight.shape[0]
        self.softcap = getattr(config, "final_logit_softcapping", None)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = nn.functional.linear(hidden, self.weight, self.bias).float()  # [B, N]
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.ids, logits)


def recorded_draft_vocab(model: nn.Module) -> torch.Tensor | None:
    """The draft vocabulary an export records (``draft_vocab_size`` in ``config.json``, ``draft_vocab.json``
    beside it, local or on the Hub), or ``None`` when it records none.

    Raises:
        SkipScheduleError: when the file is missing or does not hold ``draft_vocab_size`` valid token ids.
    """
    size = (getattr(model.config, CONFIG_KEY, None) or {}).get(DRAFT_VOCAB_SIZE_KEY)
    if size is None:
        return None
    from transformers.utils import cached_file

    path = cached_file(model.config.name_or_path, DRAFT_VOCAB_FILE, _raise_exceptions_for_missing_entries=False)
    if path is None:
        raise SkipScheduleError(f"{DRAFT_VOCAB_FILE} is missing beside config.json, which records "
                                f"{DRAFT_VOCAB_SIZE_KEY}={size}: copy it back or export again")
    with open(path) as f:
        ids = json.load(f)
    problem = draft_vocab_problem(ids, model.config.vocab_size)
    if problem is None and len(ids) != size:
        problem = f"allowed {DRAFT_VOCAB_SIZE_KEY}={size} ids, as config.json records"
    if problem is not None:
        raise SkipScheduleError(f"{DRAFT_VOCAB_FILE} of {model.config.name_or_path} is invalid: {problem}")
    return torch.tensor(ids, dtype=torch.long)
