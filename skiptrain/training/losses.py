"""Training losses over target tokens: next-token cross entropy, the distillation KL term and hidden-state matching.

They take the logits (``[N, vocab]``, :func:`target_logits`) or final hidden states (:func:`target_hidden`) of the
columns that predict a labelled token only, so padding and prompt columns never enter a loss.
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


def target_hidden(model: nn.Module, batch: Mapping[str, Any], schedule: SkipSchedule
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states ``[N, hidden]`` (after the final norm: what the LM head reads) at the columns that predict
    a labelled token of a batch, and its labels ``[N]``.

    ``batch`` has the layout of :func:`skiptrain.text.batch.collate` (``input_ids``, ``attention_mask``, ``labels``,
    ``prompt_length``); ``model`` runs under ``schedule``.
    """
    targets = batch["labels"][:, 1:]  # token at column c + 1 is predicted at column c
    selected = targets != IGNORE_INDEX
    hidden = skip_hidden_states(model, batch["input_ids"], batch["attention_mask"], schedule,
                                batch["prompt_length"])[:, :-1][selected]  # [N, H]
    return hidden, targets[selected]


def target_logits(model: nn.Module, batch: Mapping[str, Any], schedule: SkipSchedule
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 logits ``[N, vocab]`` at the target columns of :func:`target_hidden`, and its labels ``[N]``.

    The LM head runs on those columns only. Every training loss (``SkipLM``'s and
    :func:`skiptrain.training.integration.skip_loss`) is computed from these.
    """
    hidden, targets = target_hidden(model, batch, schedule)
    return decoder_parts(model).logits(hidden).float(), targets


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


def hidden_state_mse(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean squared error of ``student`` final hidden states ``[N, hidden]`` against ``teacher``'s, divided by the
    teacher's mean square, so that the term's scale does not depend on the model's hidden size or norm weights (0: the
    same states; 1: as far as predicting zeros). ``teacher`` carries no gradient."""
    teacher = teacher.detach().float()
    return F.mse_loss(student.float(), teacher) / teacher.pow(2).mean().clamp_min(torch.finfo(torch.float32).tiny)


def mean_layers_per_target(batch: Mapping[str, Any], schedule: SkipSchedule) -> float:
    """Mean executed layers over the labelled generated tokens of a batch (what ``schedule`` costs)."""
    positions = (batch["labels"][:, 1:] != IGNORE_INDEX).nonzero()[:, 1] + 1 - batch["prompt_length"]
    sizes = [len(schedule.executed_layers(int(g))) for g in positions.clamp(min=0).tolist()]
    return sum(sizes) / max(len(sizes), 1)
