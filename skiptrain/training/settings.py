"""The grouped settings of :class:`~skiptrain.training.module.SkipLM`: ``model.optimizer``, ``model.generation``,
``model.distillation`` and ``model.curriculum`` (each a dataclass that LightningCLI configures as nested keys, e.g.
``--model.optimizer.learning_rate``), and the one-line answer to an option that moved."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from skiptrain.errors import UsageError
from skiptrain.modeling.generation import SamplingConfig
from skiptrain.training.lora import RENAMED_FIELDS

LR_SCHEDULES = {
    "cosine": get_cosine_schedule_with_warmup,
    "linear": get_linear_schedule_with_warmup,
    "constant": get_constant_schedule_with_warmup,
}
TEACHERS = ("dense", "base")


@dataclass
class OptimizerSettings:
    """AdamW over the trainable weights, with linear warm-up and a decay.

    Args:
        learning_rate: Peak learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        warmup_steps: Linear learning-rate warm-up steps.
        lr_schedule: Decay after warm-up: ``cosine``, ``linear`` or ``constant``.
    """

    learning_rate: float = 2e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"

    def __post_init__(self) -> None:
        if self.lr_schedule not in LR_SCHEDULES:
            raise UsageError(f"optimizer.lr_schedule={self.lr_schedule!r} is invalid: allowed {sorted(LR_SCHEDULES)}")
        if self.learning_rate <= 0:
            raise UsageError(f"optimizer.learning_rate={self.learning_rate} is invalid: allowed > 0")
        if self.warmup_steps < 0:
            raise UsageError(f"optimizer.warmup_steps={self.warmup_steps} is invalid: allowed >= 0")

    def build(self, params: Iterable[torch.nn.Parameter], total_steps: float) -> dict[str, Any]:
        """What ``configure_optimizers`` returns: AdamW over ``params`` and its per-step scheduler.

        Args:
            total_steps: The run's optimizer steps (``trainer.estimated_stepping_batches``; may be infinite).
        """
        optimizer = torch.optim.AdamW(params, lr=self.learning_rate, betas=tuple(self.betas),
                                      weight_decay=self.weight_decay)
        total = int(total_steps) if math.isfinite(total_steps) else 10**9
        kwargs = {} if self.lr_schedule == "constant" else {"num_training_steps": max(total, 1)}
        scheduler = LR_SCHEDULES[self.lr_schedule](optimizer, num_warmup_steps=self.warmup_steps, **kwargs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


@dataclass
class GenerationSettings:
    """Generation metrics during validation and test, with the skip-aware front-end.

    Args:
        max_new_tokens: Tokens generated per example.
        num_batches: Evaluation batches scored by generation per epoch (0 disables, ``-1`` all).
        metric: ``auto`` (the data module's task decides), ``rouge`` (ROUGE-1/2/L), ``bleu`` (multi-reference
            SacreBLEU), ``both``, or ``none``; all on a 0-100 scale.
        sampling: Greedy by default.
    """

    max_new_tokens: int = 64
    num_batches: int = 2
    metric: Literal["auto", "rouge", "bleu", "both", "none"] = "auto"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


@dataclass
class Distillation:
    """Distillation of the skipped path from a teacher at full depth, added to the cross entropy: a KL term on the
    next-token distributions and, optionally, a term matching the final hidden states (what layer-pruning work uses to
    "heal" a shortened model).

    Args:
        weight: Weight of the KL term.
        temperature: Softmax temperature of teacher and student in the KL term (scaled by ``T**2``).
        hidden_weight: Weight of the hidden-state term: the mean squared error of the skipped path's final hidden
            states (after the final norm) against the teacher's at every target token, relative to the teacher's mean
            square (:func:`~skiptrain.training.losses.hidden_state_mse`); 0 disables it. A teacher run must have
            the model's hidden size.
        teacher: ``dense``: the weights being trained, run at full depth without gradient (the dense path
            teaches the skipped path; self-distillation). ``base``: the base model with the LoRA adapters
            disabled (needs ``lora``). Or the path of a checkpoint or export of an earlier (e.g. dense
            fine-tuned) run, loaded once and frozen.
    """

    weight: float = 1.0
    temperature: float = 1.0
    teacher: str = "dense"
    hidden_weight: float = 0.0

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise UsageError(f"distillation.weight={self.weight} is invalid: allowed >= 0")
        if self.hidden_weight < 0:
            raise UsageError(f"distillation.hidden_weight={self.hidden_weight} is invalid: allowed >= 0")
        if self.temperature <= 0:
            raise UsageError(f"distillation.temperature={self.temperature} is invalid: allowed > 0")
        if self.teacher not in TEACHERS and not Path(self.teacher).exists():
            raise UsageError(f"distillation.teacher={self.teacher!r} is invalid: allowed {list(TEACHERS)} or "
                             "the path of an existing checkpoint or export")


@dataclass
class Curriculum:
    """Train with a schedule that anneals from dense to ``model.schedule`` (see
    :func:`~skiptrain.core.curriculum.anneal_from_dense`); validation and export always use the target schedule.

    Args:
        fraction: Share of the training steps over which the depth of every position shrinks linearly from all
            layers to the target's; the rest of training uses the target schedule.
    """

    fraction: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise UsageError(f"curriculum.fraction={self.fraction} is invalid: allowed 0 < fraction <= 1")

    def progress(self, step: int, total_steps: int) -> float:
        """Fraction of the annealing done at optimizer step ``step`` of ``total_steps``."""
        return min(1.0, step / max(self.fraction * total_steps, 1.0))


OPTIMIZER_FIELDS = ("learning_rate", "weight_decay", "betas", "warmup_steps", "lr_schedule")
MOVED_OPTIONS = {f"model.{name}": f"model.optimizer.{name}" for name in OPTIMIZER_FIELDS}
"""Options of ``model`` that moved, each with its new name."""


def upgrade_hparams(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's stored ``SkipLM`` hyper-parameters in today's layout: those of a checkpoint written before
    ``model.optimizer`` and peft's LoRA names are moved there (a checkpoint cannot be edited as a config can)."""
    hparams = dict(hparams)
    moved = {name: hparams.pop(name) for name in OPTIMIZER_FIELDS if name in hparams}
    if moved:
        hparams["optimizer"] = {**(hparams.get("optimizer") or {}), **moved}
    if isinstance(hparams.get("lora"), Mapping):
        hparams["lora"] = {RENAMED_FIELDS.get(k, k): v for k, v in hparams["lora"].items()}
    return hparams


def moved_option(message: str) -> str | None:
    """One line naming the new key when the parser's ``message`` refuses an option of :data:`MOVED_OPTIONS` (on the
    command line, ``unrecognized arguments: --model.learning_rate ...``; in a config, ``Group 'model' does not accept
    option 'learning_rate'`` or ``Subcommand 'fit' does not accept option 'model.learning_rate'``); ``None`` for any
    other message."""
    for old, new in MOVED_OPTIONS.items():
        name = old.removeprefix("model.")
        if any(form in message for form in (f"--{old}", f"option '{old}'", f"'model' does not accept option '{name}'")):
            return f"{old} is now {new}: rename it in your config or command line"
    return None
