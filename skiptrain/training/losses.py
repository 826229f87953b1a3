"""Training losses over target-token logits: next-token cross entropy and the distillation KL term.

Both take the logits of the columns that predict a labelled token only (``[N, vocab]``, :func:`target_logits`), so
padding and prompt columns never enter a loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from skiptrain.core.schedules import SkipSchedule
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.forward import skip_hidden_states
from skiptrain.text.batch import IGNORE_INDEX


def target_logits(model: nn.Module, batch: Mapping[str, Any], schedule: SkipSchedule
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 logits ``[N, vocab]`` at the columns that predict a labelled token of a batch, and its labels ``[N]``.

    ``batch`` has the layout of :func:`skiptrain.text.batch.collate` (``input_ids``, ``attention_mask``, ``labels``,
    ``prompt_length``); ``model`` runs under ``schedule``. The LM head runs on those columns only. Every training loss
    (``SkipLM``'s and :func:`skiptrain.training.integration.skip_loss`) is computed from these.
    """
    parts = decoder_parts(model)
    targets = batch["labels"][:, 1:]  # token at column c + 1 is predicted at column c
    selected = targets != IGNORE_INDEX
    hidden = skip_hidden_states(model, batch["input_ids"], batch["attention_mask"], schedule,
                                batch["prompt_length"], parts=parts)[:, :-1][selected]  # [N, H]
    return parts.logits(hidden).float(), targets[selected]


def target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of ``logits`` ``[N, vocab]`` against ``targets`` ``[N]``."""
    return F.cross_entropy(logits.float(), targets)


def distillation_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``KL(teacher || student)`` per target token at ``temperature``, scaled by ``T**2`` (Hinton et al., 2015).

    The ``T**2`` factor keeps the gradient scale independent of the temperature. ``teacher`` carries no gradient.

    Args:
        student: Student logits ``[N, vocab]``.
        teacher: Teacher logits ``[N, vocab]`` for the same target tokens.
        temperature: Softmax temperature of both distributions (``> 0``).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} is invalid: allowed > 0")
    t = temperature
    student_log_probs = F.log_softmax(student.float() / t, dim=-1)
    teacher_log_probs = F.log_softmax(teacher.detach().float() / t, dim=-1)
    return F.kl_div(student_log_probs, teacher_log_probs, log_target=True, reduction="batchmean") * t**2
