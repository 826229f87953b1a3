"""The decode cost of a skip schedule, defined once.

ideal speedup = L / mean executed decoder layers per generated token, over N generated tokens

where ``L`` is the model's decoder layer count and the token at generated index ``g`` executes
``|executed_layers(g)|`` layers. Only decoder-layer work counts (embeddings, LM head, attention over the cache
and the prompt are left out), so a measured speedup is lower. The number depends on ``N``: a SkipDecode
schedule gets cheaper along the sequence, so every number skiptrain prints states the generated tokens it
is taken over. For one sequence of ``N`` tokens this is
:meth:`~skiptrain.core.schedules.SkipSchedule.sequence_ideal_speedup` ``(N)``; for a batch whose rows generated
different lengths, every generated token counts once (:func:`batch_ideal_speedup`, from :func:`mean_executed_layers`
over the per-row lengths).

A decode step at small batch is bound by reading the weights, and every token also reads the LM head, which no
schedule removes. :func:`parameter_read_speedup` is that limit: dense parameters read per generated token over
the schedule's, LM head included. It is the number a measured decode speedup should be held against.

:func:`skipdecode_for_speedup` goes the other way: the SkipDecode schedule whose ideal speedup meets a target.
"""

from __future__ import annotations

from collections.abc import Sequence

from skiptrain.core.schedules import PromptDepth, ScheduleError, SkipDecode, SkipSchedule


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


def batch_ideal_speedup(schedule: SkipSchedule, lengths: Sequence[int]) -> float:
    """Ideal decode speedup of rows that generated ``lengths`` tokens, every token counted once:
    ``L / mean_executed_layers(schedule, lengths)``, the decoder-layer work saved on those tokens."""
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
            f"token, ideal decode speedup: {batch_ideal_speedup(schedule, lengths):.2f}x (over {sum(lengths)} "
            "generated tokens)")


def skipdecode_for_speedup(
    num_layers: int,
    target_speedup: float,
    decay_tokens: int,
    generation_length: int | None = None,
    warmup_layers: int = 1,
    prompt_depth: PromptDepth = "all",
    max_layers: int | None = None,
    tolerance: float = 0.02,
) -> SkipDecode:
    """Pick ``min_layers``/``max_layers`` of a SkipDecode schedule for a target ideal decode speedup.

    Among all valid ``(min_layers, max_layers)`` pairs (``max_layers`` fixed when given), returns the one
    whose ideal speedup over ``generation_length`` tokens (default ``decay_tokens``) is within ``tolerance``
    (relative) of the target with the largest ``max_layers`` (early tokens keep the most depth, the decay
    is the steepest), then the closest; if no pair is within tolerance, simply the closest.
    """
    if not target_speedup >= 1.0:
        raise ScheduleError(f"target_speedup={target_speedup!r} is invalid: allowed a number >= 1")
    length = decay_tokens if generation_length is None else generation_length
    best, best_key = None, None
    tops = range(warmup_layers + 1, num_layers + 1) if max_layers is None else [max_layers]
    for top in tops:
        for bottom in range(warmup_layers + 1, top + 1):
            family = SkipDecode(min_layers=bottom, max_layers=top, warmup_layers=warmup_layers,
                                decay_tokens=decay_tokens, prompt_depth=prompt_depth)
            speedup = family.build(num_layers).sequence_ideal_speedup(length)
            error = abs(speedup - target_speedup) / target_speedup
            key = (error > tolerance, -top if error <= tolerance else 0, error)
            if best_key is None or key < best_key:
                best, best_key = family, key
    if best is None:  # max_layers leaves no valid min_layers
        raise ScheduleError(
            f"max_layers={max_layers} is invalid: allowed {warmup_layers + 1} <= max_layers <= {num_layers}"
        )
    return best


__all__ = ["batch_ideal_speedup", "cost_summary", "mean_executed_layers", "parameter_read_speedup",
           "skipdecode_for_speedup"]
