"""Random schedule families: many valid parameter draws for the invariant and agreement tests."""

from __future__ import annotations

import random

from skiptrain.core.schedules import FAMILIES, Dense, Hierarchical, ScheduleFamily, Static


def random_family(rng: random.Random, num_layers: int) -> ScheduleFamily:
    """A schedule family of a random kind with random valid parameters for ``num_layers`` layers."""
    kind = rng.choice(sorted(FAMILIES))
    prompt_depth = rng.choice(["all", "max"])
    if kind in ("skipdecode", "ranked"):
        warmup = rng.randint(1, min(3, num_layers - 1))
        low = rng.randint(warmup + 1, num_layers)
        high = rng.choice([None, rng.randint(low, num_layers)])
        ranking = {"ranking": rng.sample(range(num_layers), num_layers)} if kind == "ranked" else {}
        return FAMILIES[kind](min_layers=low, max_layers=high, warmup_layers=warmup,
                              decay_tokens=rng.randint(1, 300), prompt_depth=prompt_depth, **ranking)
    if kind == "hierarchical":
        max_stride_level = max(1, (num_layers - 1).bit_length() - 1)
        bounds = sorted(rng.sample(range(0, 200), rng.randint(1, 4)))
        level = rng.randint(1, min(len(bounds), max_stride_level))
        return Hierarchical(phase_boundaries=tuple(bounds), max_level=level,
                            warmup_layers=rng.randint(1, min(2, num_layers - 1)), prompt_depth=prompt_depth)
    if kind == "static":
        if rng.random() < 0.5:
            return Static(depth=rng.randint(2, num_layers), prompt_depth=prompt_depth)
        layers = sorted({0, *rng.sample(range(num_layers), rng.randint(1, num_layers))})
        return Static(layers=tuple(layers), prompt_depth=prompt_depth)
    return Dense(prompt_depth=prompt_depth)
