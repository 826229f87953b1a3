"""skiptrain: skip-aware fine-tuning of causal language models."""

from skiptrain.export import ExportedModel, ExportError, load_exported
from skiptrain.forward import position_ids_from_mask, skip_forward, skip_hidden_states
from skiptrain.generation import GenerationOutput, SamplingConfig, generate
from skiptrain.schedules import (
    Dense,
    Hierarchical,
    ScheduleError,
    ScheduleFamily,
    SkipDecode,
    SkipSchedule,
    Static,
    skipdecode_for_speedup,
)

__version__ = "0.1.0"

__all__ = [
    "Dense",
    "ExportError",
    "ExportedModel",
    "GenerationOutput",
    "Hierarchical",
    "SamplingConfig",
    "ScheduleError",
    "ScheduleFamily",
    "SkipDecode",
    "SkipSchedule",
    "Static",
    "generate",
    "load_exported",
    "position_ids_from_mask",
    "skip_forward",
    "skip_hidden_states",
    "skipdecode_for_speedup",
]
