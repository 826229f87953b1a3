"""skiptrain: skip-aware fine-tuning of causal language models."""

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
    "GenerationOutput",
    "Hierarchical",
    "SamplingConfig",
    "ScheduleError",
    "ScheduleFamily",
    "SkipDecode",
    "SkipSchedule",
    "Static",
    "generate",
    "position_ids_from_mask",
    "skip_forward",
    "skip_hidden_states",
    "skipdecode_for_speedup",
]
