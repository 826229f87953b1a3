"""The schedule a training curriculum runs: a target schedule annealed from dense (``model.curriculum``)."""

from __future__ import annotations

import math

from skiptrain.core.schedules import SkipSchedule


def anneal_from_dense(target: SkipSchedule, progress: float) -> SkipSchedule:
    """The schedule a curriculum trains with at ``progress`` (0: every layer, 1: ``target`` itself).

    Each executed set keeps the target's layers and gets back ``floor((1 - progress) * skipped)`` of the
    layers the target skips there, so its depth moves linearly from ``num_layers`` to the target's. Skipped
    layers come back in a fixed order: those the target drops latest along the sequence first, then the higher
    index first (for SkipDecode: the lowest layers of the top block, so every set stays a contiguous top
    block over the warm-up layers). Under that order each set is a superset of the target's and a subset of the
    set before it, so every intermediate schedule is nested and valid.

    Args:
        target: The schedule training ends with (the one exported and validated).
        progress: Fraction of the curriculum done, clipped to ``[0, 1]``.
    """
    progress = min(max(float(progress), 0.0), 1.0)
    if progress == 1.0:
        return target
    n, table = target.num_layers, target.executed_layers_table
    dropped_at = {layer: next((g for g, s in enumerate(table) if layer not in s), len(table)) for layer in range(n)}
    comeback_order = sorted(range(n), key=lambda layer: (-dropped_at[layer], -layer))

    def anneal(layers: tuple[int, ...]) -> tuple[int, ...]:
        kept = set(layers)
        skipped = [layer for layer in comeback_order if layer not in kept]
        back = math.floor((1.0 - progress) * len(skipped))
        return tuple(sorted(kept.union(skipped[:back])))

    prompt = anneal(target.prompt_layers)
    # A prompt depth below all layers would cap the sets: keep every annealed set inside the annealed prompt.
    sets = tuple(tuple(sorted(set(anneal(s)) & set(prompt))) for s in table)
    return SkipSchedule(n, prompt, sets, family="explicit",
                        params={"anneal_from_dense": {"target": target.family, "progress": progress}})


__all__ = ["anneal_from_dense"]
