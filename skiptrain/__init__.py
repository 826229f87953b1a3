"""skiptrain: skip-aware fine-tuning of causal language models.

The public names are imported lazily (PEP 562): ``from skiptrain import SkipDecode`` or ``import
skiptrain.schedules`` loads only the torch-free schedule module; the names of the forward, generation and
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
    "Dense": "skiptrain.schedules",
    "Hierarchical": "skiptrain.schedules",
    "Ranked": "skiptrain.schedules",
    "ScheduleError": "skiptrain.schedules",
    "ScheduleFamily": "skiptrain.schedules",
    "SkipDecode": "skiptrain.schedules",
    "SkipSchedule": "skiptrain.schedules",
    "Static": "skiptrain.schedules",
    "skipdecode_for_speedup": "skiptrain.schedules",
    "position_ids_from_mask": "skiptrain.forward",
    "skip_forward": "skiptrain.forward",
    "skip_hidden_states": "skiptrain.forward",
    "GenerationOutput": "skiptrain.generation",
    "SamplingConfig": "skiptrain.generation",
    "generate": "skiptrain.generation",
    "ExportError": "skiptrain.export",
    "ExportedModel": "skiptrain.export",
    "load_exported": "skiptrain.export",
    "PairCollator": "skiptrain.integration",
    "skip_aware": "skiptrain.integration",
    "skip_loss": "skiptrain.integration",
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
    "Static",
    "generate",
    "load_exported",
    "position_ids_from_mask",
    "skip_aware",
    "skip_forward",
    "skip_hidden_states",
    "skip_loss",
    "skipdecode_for_speedup",
]

if TYPE_CHECKING:
    from skiptrain.export import ExportedModel, ExportError, load_exported
    from skiptrain.forward import position_ids_from_mask, skip_forward, skip_hidden_states
    from skiptrain.generation import GenerationOutput, SamplingConfig, generate
    from skiptrain.integration import PairCollator, skip_aware, skip_loss
    from skiptrain.schedules import (
        Dense,
        Hierarchical,
        Ranked,
        ScheduleError,
        ScheduleFamily,
        SkipDecode,
        SkipSchedule,
        Static,
        skipdecode_for_speedup,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skiptrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
