"""LoRA adapters through peft: the settings of ``model.lora`` and the adapted model they describe."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from skiptrain.errors import UsageError
from skiptrain.modeling.architectures import architecture


@dataclass
class LoraSettings:
    """LoRA adapters through peft (the base weights stay frozen).

    Args:
        r: Adapter rank.
        alpha: Scaling numerator (``lora_alpha``).
        dropout: Dropout on the adapter input.
        target_modules: Module names to adapt; ``None`` uses the architecture's attention projections.
        bias: Which biases to train: ``none``, ``all`` or ``lora_only``.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] | None = None
    bias: Literal["none", "all", "lora_only"] = "none"

    def __post_init__(self) -> None:
        if self.r < 1:
            raise UsageError(f"lora.r={self.r} is invalid: allowed an adapter rank >= 1 (or lora: null to fine-tune "
                             "every weight)")
        if self.alpha <= 0:
            raise UsageError(f"lora.alpha={self.alpha} is invalid: allowed > 0")
        if not 0 <= self.dropout < 1:
            raise UsageError(f"lora.dropout={self.dropout} is invalid: allowed 0 <= dropout < 1")
        if self.target_modules is not None and not self.target_modules:
            raise UsageError("lora.target_modules=[] is invalid: allowed a list of module names, or null for the "
                             "architecture's attention projections")

    @classmethod
    def from_hparams(cls, stored: LoraSettings | Mapping[str, Any] | None) -> LoraSettings | None:
        """The settings as a checkpoint stores them: the object itself, or its fields (a LightningCLI config)."""
        if stored is None or isinstance(stored, LoraSettings):
            return stored
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(stored).items() if k in names})


def with_adapters(model: nn.Module, settings: LoraSettings) -> PeftModel:
    """``model`` wrapped in fresh LoRA adapters (default targets: the architecture table's)."""
    targets = settings.target_modules or architecture(model.config.model_type).lora_targets
    return get_peft_model(model, LoraConfig(
        r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout, target_modules=list(targets),
        bias=settings.bias, task_type="CAUSAL_LM",
    ))
