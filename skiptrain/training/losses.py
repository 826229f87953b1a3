"""Training losses over target-token logits: next-token cross entropy and the distillation KL term.

Both take the logits of the columns that predict a labelled token only (``[N, vocab]``, see
:meth:`skiptrain.training.module.SkipLM.target_logits`), so padding and prompt columns never enter a loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
