"""Candidate schedules for ``skiptrain calibrate``, chosen and compared without a model (pure Python, no torch).

- **The request**, checked against the model's depth before any weights or data are read
  (:class:`CalibrationRequest`).
- **The candidates**: a grid per family (:func:`grid_candidates`), or a search per target speedup: every family's
  parameters are enumerated (:func:`family_space`), costed over the validation targets' lengths without a forward
  pass, and the few whose realised ideal speedup lies in ``[target, target * (1 + tolerance)]`` are kept
  (:func:`search_candidates`).
- **The choice**, once :mod:`skiptrain.training.calibrate` has scored them (:class:`Candidate`): the Pareto front of
  loss against ideal speedup (:func:`pareto_front`) and, for each target, the lowest-loss candidate that reaches it
  (:func:`best_for_target`).
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skiptrain.core.schedule_files import read_grid
from skiptrain.core.schedules import FAMILIES, Hierarchical, Ranked, ScheduleError, ScheduleFamily, Static
from skiptrain.core.speedup import batch_ideal_speedup
from skiptrain.errors import UsageError

SEARCHED_FAMILIES = ("skipdecode", "ranked", "hierarchical", "static")
"""Families :func:`search_candidates` enumerates (``ranked`` uses the measured importance ranking)."""
HIERARCHICAL_STARTS = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
"""Generated indices at which the searched Hierarchical schedules may start a phase (those below the longest target)."""
DEFAULT_TARGETS = (1.5, 2.0, 3.0)

Grid = Mapping[str, Mapping[str, Sequence[Any]]]
"""A calibration grid: ``{family: {parameter: [values]}}``."""


# -- the request, checked before any weights or data are read ----------------------------------------------------------
@dataclass(frozen=True)
class CalibrationRequest:
    """What ``skiptrain calibrate`` was asked for, checked by :meth:`checked` against the model's depth alone.

    Args:
        targets: Target ideal speedups, each reachable by some candidate.
        families: Families searched for each target (when no ``grid`` is given).
        grid: ``{family: {parameter: [values]}}``, with at least one valid schedule, or ``None`` to search.
        per_target: Configurations scored per family and target in the search (>= 1).
        tolerance: Relative window above each target that the search scores (>= 0).
        num_batches: Validation batches scored (``-1``: all).
        generation_batches: Validation batches on which the Pareto front is also decoded (>= 0).
    """

    targets: tuple[float, ...] = DEFAULT_TARGETS
    families: tuple[str, ...] = SEARCHED_FAMILIES
    grid: Grid | None = None
    per_target: int = 2
    tolerance: float = 0.1
    num_batches: int = -1
    generation_batches: int = 0

    @classmethod
    def checked(
        cls,
        num_layers: int,
        targets: Sequence[float] | None = None,
        families: Sequence[str] | None = None,
        grid: str | os.PathLike | None = None,
        per_target: int = 2,
        tolerance: float = 0.1,
        num_batches: int = -1,
        generation_batches: int = 0,
    ) -> CalibrationRequest:
        """The request for a model of ``num_layers`` decoder layers, ``grid`` read from its file.

        Raises:
            UsageError: naming the first option that is invalid: an unknown family, a grid without a valid schedule
                for ``num_layers``, a target below 1 or above :func:`highest_speedup` of the candidates, a count
                out of range.
            InputError: for a grid file that cannot be read.
        """
        families = tuple(SEARCHED_FAMILIES if families is None else families)
        unknown = sorted(set(families) - set(SEARCHED_FAMILIES))
        if unknown or not families:
            raise UsageError(f"families={list(families)} is invalid: allowed some of {list(SEARCHED_FAMILIES)}")
        for name, value, low in (("per_target", per_target, 1), ("generation_batches", generation_batches, 0)):
            if value < low:
                raise UsageError(f"{name}={value} is invalid: allowed >= {low}")
        if not tolerance >= 0:
            raise UsageError(f"tolerance={tolerance} is invalid: allowed >= 0")
        if num_batches == 0 or num_batches < -1:
            raise UsageError(f"num_batches={num_batches} is invalid: allowed -1 (all) or >= 1")
        request = cls(tuple(DEFAULT_TARGETS if targets is None else targets), families,
                      read_grid(grid) if grid is not None else None, per_target, tolerance, num_batches,
                      generation_batches)
        request.check_targets(num_layers)
        return request

    def candidate_space(self, num_layers: int) -> list[ScheduleFamily]:
        """Every configuration the calibration may score (the grid's valid ones, or the searched families'), with a
        placeholder ranking (a ranking changes which layers run, not how many)."""
        ranking = range(num_layers)
        if self.grid:
            return grid_candidates(self.grid, num_layers, ranking)
        lengths = [HIERARCHICAL_STARTS[-1] + 1]  # long enough for every phase start the search tries
        return [f for name in self.families for f in family_space(name, num_layers, lengths, ranking)]

    def check_targets(self, num_layers: int) -> None:
        """Refuse targets below 1, and targets above the highest ideal speedup of :meth:`candidate_space`."""
        for target in self.targets:
            if not target >= 1:
                raise ScheduleError(f"target={target} is invalid: allowed ideal speedups >= 1")
        highest = highest_speedup(self.candidate_space(num_layers), num_layers)
        beyond = [t for t in self.targets if t > highest]
        if beyond:
            searched = "the grid's schedules" if self.grid else f"the families {list(self.families)}"
            raise ScheduleError(f"targets={beyond} are invalid for a model of {num_layers} decoder layers: allowed "
                                f"ideal speedups 1 <= target <= {highest:.2f}, the most {searched} reach")


# -- the candidates ----------------------------------------------------------------------------------------------------
def _decay_spans(lengths: Sequence[int]) -> list[int]:
    """SkipDecode decay spans to try: the median and the longest target length."""
    return sorted({max(1, round(statistics.median(lengths))), max(lengths)})


def family_space(name: str, num_layers: int, lengths: Sequence[int], ranking: Sequence[int]) -> list[ScheduleFamily]:
    """Every configuration of a family that :func:`search_candidates` costs (warm-up: layer 0 only)."""
    if name in ("skipdecode", "ranked"):
        extra = {"ranking": tuple(ranking)} if name == "ranked" else {}
        return [FAMILIES[name](min_layers=low, max_layers=high, decay_tokens=span, **extra)
                for span in _decay_spans(lengths) for high in range(2, num_layers + 1) for low in range(2, high + 1)]
    if name == "hierarchical":
        starts = [b for b in HIERARCHICAL_STARTS if b < max(lengths)]
        levels = (num_layers - 1).bit_length() - 1  # the largest k with 2**k < num_layers
        return [Hierarchical(phase_boundaries=bounds)
                for count in range(1, levels + 1) for bounds in itertools.combinations(starts, count)]
    if name == "static":
        return [Static(depth=depth) for depth in range(2, num_layers + 1)]
    raise ScheduleError(f"family={name!r} is invalid for calibration: allowed {list(SEARCHED_FAMILIES)}")


def search_candidates(
    families: Sequence[str],
    targets: Sequence[float],
    num_layers: int,
    lengths: Sequence[int],
    ranking: Sequence[int],
    per_target: int = 2,
    tolerance: float = 0.1,
) -> list[ScheduleFamily]:
    """For each target and family, up to ``per_target`` configurations whose realised ideal speedup over
    ``lengths`` lies in ``[target, target * (1 + tolerance)]``, spread evenly over the family's parameter order;
    when none lies there, the one closest above the target."""
    chosen: dict[ScheduleFamily, None] = {}
    for name in families:
        costed = [(f, batch_ideal_speedup(f.build(num_layers), lengths))
                  for f in family_space(name, num_layers, lengths, ranking)]
        for target in targets:
            window = [f for f, s in costed if target <= s <= target * (1 + tolerance)]
            if not window:
                above = sorted((s, i) for i, (_, s) in enumerate(costed) if s >= target)
                window = [costed[above[0][1]][0]] if above else []
            step = max(1, math.ceil(len(window) / per_target))
            chosen.update(dict.fromkeys(window[step // 2::step][:per_target]))
    return list(chosen)


def grid_candidates(grid: Grid, num_layers: int, ranking: Sequence[int]) -> list[ScheduleFamily]:
    """Every valid combination of a grid ``{family: {parameter: [values]}}`` (``ranked`` gets ``ranking`` unless
    the grid gives one); combinations the family refuses (e.g. ``min_layers > max_layers``) are left out.

    Raises:
        ScheduleError: for an unknown family or parameter, or a grid without a single valid combination.
    """
    candidates, refusal = [], None
    for name, axes in grid.items():
        family = FAMILIES.get(name)
        if family is None:
            raise ScheduleError(f"grid family={name!r} is invalid: allowed {sorted(FAMILIES)}")
        fields = {f for f in family.__dataclass_fields__}
        unknown = sorted(set(axes) - fields)
        if unknown:
            raise ScheduleError(f"grid {name}: parameters {unknown} are invalid: allowed {sorted(fields)}")
        axes = {"ranking": [list(ranking)], **axes} if family is Ranked else dict(axes)
        for values in itertools.product(*axes.values()):
            candidate = family(**dict(zip(axes, values, strict=True)))
            try:
                candidate.build(num_layers)
            except ScheduleError as err:
                refusal = refusal or f"{name} {candidate.params()}: {err}"
                continue
            candidates.append(candidate)
    if not candidates:
        raise ScheduleError(f"grid={dict(grid)} has no valid schedule for {num_layers} decoder layers: change its "
                            f"values so that at least one combination is valid (the first refused: {refusal})")
    return candidates


def highest_speedup(families: Iterable[ScheduleFamily], num_layers: int) -> float:
    """The highest ideal speedup any of ``families`` has on ``num_layers`` layers, in its deepest-skipping steady
    state (its last executed set): no realised speedup over any target lengths is higher."""
    schedules = (family.build(num_layers) for family in families)
    return max(num_layers / len(s.executed_layers(s.span - 1)) for s in schedules)


# -- the choice --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    """One scored schedule.

    Args:
        family: The schedule family and its parameters (what a recipe's ``model.schedule`` holds).
        loss: Teacher-forced validation loss under the schedule.
        mean_layers: Mean executed decoder layers per generated token over the validation targets' lengths.
        ideal_speedup: ``num_layers / mean_layers``.
        generation: Generation metrics on a validation subset (only for the Pareto front, when asked for).
    """

    family: ScheduleFamily
    loss: float
    mean_layers: float
    ideal_speedup: float
    generation: dict[str, float] = field(default_factory=dict)

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def name(self) -> str:
        return self.family.name

    def row(self) -> dict[str, Any]:
        """One flat row of the table."""
        return {"family": self.name, "params": self.family.params(), "loss": self.loss, "perplexity": self.perplexity,
                "mean_layers": self.mean_layers, "ideal_speedup": self.ideal_speedup, **self.generation}


def pareto_front(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Candidates no other beats on both axes (lower or equal loss at higher or equal ideal speedup, one
    strictly), by increasing ideal speedup."""
    front = [c for c in candidates
             if not any(o.loss <= c.loss and o.ideal_speedup >= c.ideal_speedup
                        and (o.loss < c.loss or o.ideal_speedup > c.ideal_speedup) for o in candidates)]
    return sorted(front, key=lambda c: (c.ideal_speedup, c.loss))


def best_for_target(candidates: Sequence[Candidate], target: float, family: str | None = None) -> Candidate | None:
    """The lowest-loss candidate (of ``family``, if given) whose ideal speedup reaches ``target``; ``None`` if none
    does."""
    reaching = [c for c in candidates if c.ideal_speedup >= target and (family is None or c.name == family)]
    return min(reaching, key=lambda c: (c.loss, -c.ideal_speedup), default=None)


__all__ = [
    "DEFAULT_TARGETS",
    "SEARCHED_FAMILIES",
    "CalibrationRequest",
    "Candidate",
    "Grid",
    "best_for_target",
    "family_space",
    "grid_candidates",
    "highest_speedup",
    "pareto_front",
    "search_candidates",
]
