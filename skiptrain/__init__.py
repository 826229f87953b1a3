"""skiptrain: skip-aware fine-tuning of causal language models.

The public names are imported lazily (PEP 562): ``from skiptrain import SkipDecode`` or ``import
skiptrain.core.schedules`` loads only the torch-free schedule module; the names of the forward, generation and
export modules import torch, transformers, peft and Lightning on first access.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("skiptrain")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0"

# public name -> the submodule that defines it
_LAZY: dict[str, str] = {
    "Dense": "skiptrain.core.schedules",
    "Hierarchical": "skiptrain.core.schedules",
    "Ranked": "skiptrain.core.schedules",
    "ScheduleError": "skiptrain.core.schedules",
    "ScheduleFamily": "skiptrain.core.schedules",
    "SkipDecode": "skiptrain.core.schedules",
    "SkipSchedule": "skiptrain.core.schedules",
    "Static": "skiptrain.core.schedules",
    "skipdecode_for_speedup": "skiptrain.core.speedup",
    "position_ids_from_mask": "skiptrain.modeling.forward",
    "skip_forward": "skiptrain.modeling.forward",
    "skip_hidden_states": "skiptrain.modeling.forward",
    "GenerationOutput": "skiptrain.modeling.generation",
    "SamplingConfig": "skiptrain.modeling.generation",
    "generate_under_schedule": "skiptrain.modeling.generation",
    "SpeculativeOutput": "skiptrain.frontends.speculative",
    "generate_lossless": "skiptrain.frontends.speculative",
    "ExportError": "skiptrain.export.format",
    "ExportedModel": "skiptrain.export.load",
    "load_exported": "skiptrain.export.load",
    "PairCollator": "skiptrain.training.integration",
    "skip_aware": "skiptrain.training.integration",
    "skip_loss": "skiptrain.training.integration",
}

__all__ = [  # a literal list, so linters and type checkers see the public names
    "Dense",
    "ExportError",
    "ExportedModel",
    "GenerationOutput",
    "Hierarchical",
    "PairCollator",
    "Ranked",
    "SamplingConfig",
    "ScheduleError",
    "ScheduleFamily",
    "SkipDecode",
    "SkipSchedule",
    "SpeculativeOutput",
    "Static",
    "generate_lossless",
    "generate_under_schedule",
    "load_exported",
    "position_ids_from_mask",
    "skip_aware",
    "skip_forward",
    "skip_hidden_states",
    "skip_loss",
    "skipdecode_for_speedup",
]

if TYPE_CHECKING:
    from skiptrain.core.schedules import (
        Dense,
        Hierarchical,
        Ranked,
        ScheduleError,
        ScheduleFamily,
        SkipDecode,
        SkipSchedule,
        Static,
    )
    from skiptrain.core.speedup import skipdecode_for_speedup
    from skiptrain.export.format import ExportError
    from skiptrain.export.load import ExportedModel, load_exported
    from skiptrain.frontends.speculative import SpeculativeOutput, generate_lossless
    from skiptrain.modeling.forward import position_ids_from_mask, skip_forward, skip_hidden_states
    from skiptrain.modeling.generation import GenerationOutput, SamplingConfig, generate_under_schedule
    from skiptrain.training.integration import PairCollator, skip_aware, skip_loss


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skiptrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
