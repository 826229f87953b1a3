"""LoRA adapters through peft: ``model.lora`` holds fields of peft's own ``LoraConfig``, checked and passed on.

Any ``LoraConfig`` field may be given (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules`` including peft's
``all-linear``, ``use_dora``, ``use_rslora``, ``modules_to_save``, ...); skiptrain sets ``task_type`` and, for
``target_modules: null``, the architecture's attention projections. A name that is not a field is refused in one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from typing import Any

import torch
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model
from peft.utils.constants import INCLUDE_LINEAR_LAYERS_SHORTHAND
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from skiptrain.errors import UsageError
from skiptrain.modeling.architectures import architecture, check_lora_targets

__all__ = ["DEFAULTS", "RENAMED_FIELDS", "check_targets", "lora_config", "lora_fields", "with_adapters"]

DEFAULTS = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05}
"""skiptrain's defaults where they differ from peft's."""
RENAMED_FIELDS = {"alpha": "lora_alpha", "dropout": "lora_dropout"}
"""skiptrain's former names of ``model.lora`` fields, each with peft's name."""


def _field_names() -> list[str]:
    """LoraConfig's own fields: not PeftConfig's (``task_type``, ``peft_type``, ... are peft's or skiptrain's)."""
    common = {f.name for f in dataclasses.fields(PeftConfig)}
    return [f.name for f in dataclasses.fields(LoraConfig) if f.init and f.name not in common]


def lora_fields(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` checked against peft's ``LoraConfig`` fields, with skiptrain's :data:`DEFAULTS` filled in.

    Raises:
        UsageError: in one line, for a name that is not a field (or skiptrain's former name of one), or a value
            peft or skiptrain refuses.
    """
    if not isinstance(given, Mapping):
        raise UsageError(f"lora={given!r} is invalid: allowed a mapping of peft LoraConfig fields, e.g. "
                         "{r: 16, lora_alpha: 32, target_modules: all-linear}, or null to fine-tune every weight")
    allowed = _field_names()
    for name in given:
        if name in RENAMED_FIELDS:
            raise UsageError(f"lora.{name} is now lora.{RENAMED_FIELDS[name]} (peft LoraConfig's name): rename it")
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(f"lora.{name} is not a field of peft's LoraConfig{hint}: allowed {allowed}")
    fields = {**DEFAULTS, **given}
    if fields["r"] < 1:
        raise UsageError(f"lora.r={fields['r']} is invalid: allowed an adapter rank >= 1 (or lora: null to fine-tune "
                         "every weight)")
    if fields["lora_alpha"] <= 0:
        raise UsageError(f"lora.lora_alpha={fields['lora_alpha']} is invalid: allowed > 0")
    if not 0 <= fields["lora_dropout"] < 1:
        raise UsageError(f"lora.lora_dropout={fields['lora_dropout']} is invalid: allowed 0 <= lora_dropout < 1")
    if fields.get("target_modules") is not None and not fields["target_modules"]:
        raise UsageError(f"lora.target_modules={fields['target_modules']!r} is invalid: allowed module names, "
                         "'all-linear', or null for the architecture's attention projections")
    lora_config(fields)  # peft's own checks (e.g. use_dora with an unsupported option)
    return fields


def lora_config(fields: Mapping[str, Any], model_type: str | None = None) -> LoraConfig:
    """peft's ``LoraConfig`` of checked :func:`lora_fields`, for a causal LM; ``target_modules: null`` becomes the
    attention projections of ``model_type``'s architecture when one is given.

    Raises:
        UsageError: with peft's own message, on one line.
    """
    fields = dict(fields)
    if fields.get("target_modules") is None and model_type is not None:
        fields["target_modules"] = list(architecture(model_type).lora_targets)
    try:
        return LoraConfig(task_type="CAUSAL_LM", **fields)
    except (TypeError, ValueError) as err:
        raise UsageError(f"lora={dict(fields)} is invalid for peft's LoraConfig: {' '.join(str(err).split())}"
                         ) from err


def check_targets(config: PretrainedConfig, targets: str | list[str] | None) -> None:
    """Refuse ``target_modules`` that match nothing in a model of ``config`` (built on the meta device: no weights),
    before any weights load: names as :func:`~skiptrain.modeling.architectures.check_lora_targets`, a regex as peft
    matches it (the whole module name); ``None`` and ``all-linear`` always match.

    Raises:
        UsageError: naming the targets.
    """
    if targets is None or targets == INCLUDE_LINEAR_LAYERS_SHORTHAND:
        return
    if not isinstance(targets, str):
        check_lora_targets(config, targets)
        return
    with torch.device("meta"):
        names = [name for name, _ in AutoModelForCausalLM.from_config(config).named_modules()]
    if not any(re.fullmatch(targets, name) for name in names):
        example = next((name for name in names if name.endswith("_proj")), names[-1])
        raise UsageError(f"lora.target_modules={targets!r} is invalid: the regex matches no module of "
                         f"model_type={config.model_type!r} (peft matches it against whole module names, e.g. "
                         f"{example!r}); allowed a regex, a list of names, or {INCLUDE_LINEAR_LAYERS_SHORTHAND!r}")


def with_adapters(model: nn.Module, fields: Mapping[str, Any]) -> PeftModel:
    """``model`` wrapped in fresh LoRA adapters described by ``fields`` (see :func:`lora_fields`).

    Raises:
        UsageError: for ``target_modules`` that match no module of ``model`` (peft's message, on one line).
    """
    config = lora_config(lora_fields(fields), model.config.model_type)
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # e.g. a target_modules regex that matches nothing
        raise UsageError(f"lora.target_modules={config.target_modules!r} is invalid: "
                         f"{' '.join(str(err).split())}") from err
