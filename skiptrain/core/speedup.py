"""The decode cost of a skip schedule, defined once.

ideal speedup = L / mean executed decoder layers per generated token, over N generated tokens

where ``L`` is the model's decoder layer count and the token at generated index ``g`` executes
``|executed_layers(g)|`` layers. Only decoder-layer work counts (embeddings, LM head, attention over the cache
and the prompt are left out), so a measured speedup is lower. The number depends on ``N``: a SkipDecode
schedule gets cheaper along the sequence, so every number skiptrain prints states the generated tokens it
is taken over. For one sequence of ``N`` tokens this is :meth:`~skiptrain.core.schedules.SkipSchedule.ideal_speedup`
``(N)``; for a batch whose rows generated different lengths, every generated token counts once
(:func:`mean_executed_layers` over the per-row lengths).

A decode step at small batch is bound by reading the weights, and every token also reads the LM head, which no
schedule removes. :func:`parameter_read_speedup` is that limit: dense parameters read per generated token over
the schedule's, LM head included. It is the number a measured decode speedup should be held against.
"""

from __future__ import annotations

from collections.abc import Sequence

from skiptrain.core.schedules import ScheduleError, SkipSchedule


def mean_executed_layers(schedule: SkipSchedule, lengths: Sequence[int]) -> float:
    """Mean executed decoder layers per generated token over rows that generated ``lengths`` tokens.

    For a single row of ``N`` tokens this equals ``schedule.mean_layers_per_token(N)``.

    Raises:
        ScheduleError: If ``lengths`` has a negative entry or generates no token at all.
    """
    lengths = list(lengths)
    if any(n < 0 for n in lengths) or sum(lengths) < 1:
        raise ScheduleError(f"lengths={lengths} is invalid: allowed generated lengths >= 0 summing to >= 1")
    return sum(schedule.layers_run(n) for n in lengths) / sum(lengths)


def ideal_speedup(schedule: SkipSchedule, lengths: Sequence[int]) -> float:
    """``L / mean_executed_layers(schedule, lengths)``: the decoder-layer work saved on those generated tokens."""
    return schedule.num_layers / mean_executed_layers(schedule, lengths)


def parameter_read_speedup(
    schedule: SkipSchedule, lengths: Sequence[int], layer_params: Sequence[int], head_params: int
) -> float:
    """Dense over scheduled parameters read per generated token, over rows that generated ``lengths`` tokens.

    Args:
        schedule: The schedule.
        lengths: Tokens generated per row.
        layer_params: Parameters of each decoder layer, bottom layer first.
        head_params: Parameters every token reads whatever the schedule: the LM head (and final norm).

    Raises:
        ScheduleError: for lengths :func:`mean_executed_layers` refuses, or one count per layer missing.
    """
    if len(layer_params) != schedule.num_layers:
        raise ScheduleError(f"layer_params has {len(layer_params)} entries: allowed one per decoder layer "
                            f"({schedule.num_layers})")
    mean_executed_layers(schedule, lengths)  # validates the lengths
    tokens = sum(lengths)
    scheduled = sum(layer_params[layer] for n in lengths for layers in schedule.materialize(n) for layer in layers)
    return (sum(layer_params) + head_params) / (scheduled / tokens + head_params)


def cost_summary(schedule: SkipSchedule, lengths: Sequence[int]) -> str:
    """``"2.75 of 4 decoder layers per generated token, ideal decode speedup: 1.45x (over 11 generated tokens)"``."""
    return (f"{mean_executed_layers(schedule, lengths):.2f} of {schedule.num_layers} decoder layers per generated "
            f"token, ideal decode speedup: {ideal_speedup(schedule, lengths):.2f}x (over {sum(lengths)} generated "
            "tokens)")


__all__ = ["cost_summary", "ideal_speedup", "mean_executed_layers", "parameter_read_speedup"]
