"""Choose a skip schedule from data (``skiptrain calibrate``): every candidate scored by one forward pass.

The skip-aware training forward equals KV-cached decoding under the same schedule (:mod:`skiptrain.modeling.forward`),
so the teacher-forced loss of the validation targets under a schedule is what decoding with that schedule would
score, token by token, without decoding anything. Calibration measures, on the same validation batches:

- a **layer importance profile**: for each decoder layer, the loss increase when only that layer is skipped for
  generated positions, and the cosine similarity between its input and output hidden states on the target
  columns (:func:`layer_importance`);
- every **candidate** schedule: its teacher-forced loss and perplexity, computed exactly as
  :meth:`~skiptrain.training.module.SkipLM.validation_step` computes ``val/loss_skip``, and its realised cost, the mean
  executed layers over the validation targets' actual lengths and the ideal speedup that implies
  (:mod:`skiptrain.core.speedup`);
- the **Pareto front** of loss against ideal speedup and, for each target speedup, the lowest-loss candidate
  that reaches it (:func:`pareto_front`, :func:`best_for_target`).

Candidates come from a grid per family (:func:`grid_candidates`) or are searched for each target speedup:
every family's parameters are enumerated, costed without a forward pass, and the few whose realised speedup
lies in ``[target, target * (1 + tolerance)]`` are scored (:func:`search_candidates`).
:mod:`skiptrain.training.calibration_report` writes the results.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from torchmetrics import MeanMetric
from tqdm.auto import tqdm

from skiptrain.core.schedules import (
    FAMILIES,
    Dense,
    Hierarchical,
    Ranked,
    ScheduleError,
    ScheduleFamily,
    SkipSchedule,
    Static,
)
from skiptrain.core.speedup import mean_executed_layers
from skiptrain.errors import DataError, InputError, UsageError
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.forward import skip_hidden_states
from skiptrain.text.batch import IGNORE_INDEX
from skiptrain.training.losses import target_cross_entropy

if TYPE_CHECKING:
    from skiptrain.training.module import SkipLM

SEARCHED_FAMILIES = ("skipdecode", "ranked", "hierarchical", "static")
"""Families :func:`search_candidates` enumerates (``ranked`` uses the measured importance ranking)."""
HIERARCHICAL_STARTS = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
"""Generated indices at which the searched Hierarchical schedules may start a phase (those below the longest target)."""
DEFAULT_TARGETS = (1.5, 2.0, 3.0)

Grid = Mapping[str, Mapping[str, Sequence[Any]]]
"""A calibration grid: ``{family: {parameter: [values]}}``."""


# -- measuring --------------------------------------------------------------------------------------------------
def target_lengths(batches: Iterable[Mapping[str, Any]]) -> list[int]:
    """Labelled target tokens of every row: the generated lengths the realised cost is taken over."""
    return [int(n) for batch in batches for n in (batch["labels"] != IGNORE_INDEX).sum(dim=1).tolist()]


@torch.no_grad()
def schedule_loss(module: SkipLM, batches: Iterable[Mapping[str, Any]], schedule: SkipSchedule) -> float:
    """Teacher-forced loss of the batches' targets under ``schedule``: ``val/loss_skip`` of a validation run.

    Each batch's mean cross entropy is weighted by its labelled tokens, exactly as
    :meth:`~skiptrain.training.module.SkipLM.validation_step` accumulates it.
    """
    mean = MeanMetric()
    for batch in batches:
        weight = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        if weight:
            mean.update(target_cross_entropy(*module.target_logits(batch, schedule)), weight)
    return float(mean.compute())


@dataclass(frozen=True)
class LayerImportance:
    """How much one decoder layer matters on the validation targets.

    Args:
        layer: Decoder layer index.
        loss_increase: Validation loss with only this layer skipped for generated positions, minus the dense
            loss; ``None`` for layer 0, which every schedule runs.
        cosine: Mean cosine similarity between the layer's input and output hidden states on the columns that
            predict a target token (1: the layer changes nothing there).
    """

    layer: int
    loss_increase: float | None
    cosine: float


def skip_one_layer(num_layers: int, layer: int) -> SkipSchedule:
    """Every layer for the prompt, every layer but ``layer`` for generated positions."""
    rest = tuple(i for i in range(num_layers) if i != layer)
    return SkipSchedule(num_layers, tuple(range(num_layers)), (rest,), family="explicit", params={"skip": layer})


@torch.no_grad()
def layer_cosines(module: SkipLM, batches: Iterable[Mapping[str, Any]]) -> list[float]:
    """Mean cosine similarity between each layer's input and output on target-predicting columns (dense)."""
    parts = decoder_parts(module.model)
    sums, count, selected = [0.0] * parts.num_layers, 0, None

    def hook(index: int) -> Callable[..., None]:
        def record(layer: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            inputs = args[0] if args else kwargs["hidden_states"]
            outputs = output[0] if isinstance(output, tuple) else output
            columns = selected[:, : inputs.shape[1]]
            cosine = torch.nn.functional.cosine_similarity(inputs[columns].float(), outputs[columns].float(), dim=-1)
            sums[index] += float(cosine.sum())
        return record

    handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(parts.layers)]
    try:
        dense = Dense().build(parts.num_layers)
        for batch in batches:
            selected = torch.zeros_like(batch["labels"], dtype=torch.bool)
            selected[:, :-1] = batch["labels"][:, 1:] != IGNORE_INDEX  # column c predicts the token at c + 1
            count += int(selected.sum())
            skip_hidden_states(module.model, batch["input_ids"], batch["attention_mask"], dense,
                               batch["prompt_length"], parts=parts)
    finally:
        for handle in handles:
            handle.remove()
    return [s / max(count, 1) for s in sums]


def layer_importance(module: SkipLM, batches: Sequence[Mapping[str, Any]], dense_loss: float | None = None,
                     progress: bool = True) -> list[LayerImportance]:
    """The importance profile of every decoder layer (see :class:`LayerImportance`)."""
    num_layers = decoder_parts(module.model).num_layers
    dense_loss = schedule_loss(module, batches, Dense().build(num_layers)) if dense_loss is None else dense_loss
    cosines = layer_cosines(module, batches)
    profile = [LayerImportance(0, None, cosines[0])]
    for layer in tqdm(range(1, num_layers), desc="layer importance", unit="layer", disable=not progress):
        loss = schedule_loss(module, batches, skip_one_layer(num_layers, layer))
        profile.append(LayerImportance(layer, loss - dense_loss, cosines[layer]))
    return profile


def importance_ranking(profile: Sequence[LayerImportance]) -> list[int]:
    """Layers most important first: layer 0 (always run), then by loss increase, then by lower cosine."""
    measured = sorted((p for p in profile if p.loss_increase is not None), key=lambda p: (-p.loss_increase, p.cosine))
    return [p.layer for p in profile if p.loss_increase is None] + [p.layer for p in measured]


# -- candidates -------------------------------------------------------------------------------------------------
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
        costed = [(f, num_layers / mean_executed_layers(f.build(num_layers), lengths))
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


# -- the request, checked before any weights or data are read ------------------------------------------------------
def read_grid(path: str | os.PathLike) -> dict[str, dict[str, list[Any]]]:
    """A calibration grid file: ``{family: {parameter: [values]}}`` (a single value counts as a list of one).

    Raises:
        InputError: for a file that cannot be read as YAML.
        UsageError: for YAML that is not such a mapping.
    """
    try:
        grid = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise InputError(f"grid={str(path)!r} cannot be read ({' '.join(str(err).split())}): allowed a YAML file "
                         "{family: {parameter: [values]}}") from err
    if not isinstance(grid, dict) or not all(isinstance(axes, dict) for axes in grid.values()):
        raise UsageError(f"grid={str(path)!r} is invalid: allowed a YAML mapping {{family: {{parameter: [values]}}}}")
    return {name: {k: v if isinstance(v, list) else [v] for k, v in axes.items()} for name, axes in grid.items()}


def highest_speedup(families: Iterable[ScheduleFamily], num_layers: int) -> float:
    """The highest ideal speedup any of ``families`` has on ``num_layers`` layers, in its deepest-skipping steady
    state (its last executed set): no realised speedup over any target lengths is higher."""
    schedules = (family.build(num_layers) for family in families)
    return max(num_layers / len(s.executed_layers(s.span - 1)) for s in schedules)


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


def validation_batches(datamodule: Any, num_batches: int = -1) -> list[dict[str, Any]]:
    """The first ``num_batches`` validation batches of ``datamodule`` (``-1``: all), on the CPU.

    Raises:
        DataError: when the data module has no validation batches.
    """
    datamodule.setup("validate")
    batches = list(itertools.islice(datamodule.val_dataloader(), None if num_batches == -1 else num_batches))
    if not batches:
        raise DataError("the data module has no validation batches: give data.data_files: {validation: FILE} (or "
                        "data whose split has a validation part) to calibrate on")
    return batches


# -- results ----------------------------------------------------------------------------------------------------
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


@dataclass
class Calibration:
    """What :func:`calibrate` measured.

    Args:
        num_layers: Decoder layers of the model.
        lengths: Validation target lengths the realised costs are taken over.
        dense_loss: Teacher-forced validation loss with every layer.
        profile: The layer importance profile.
        ranking: Layers most important first (from ``profile``), the ranking of the ``ranked`` candidates.
        candidates: Every scored candidate, the dense schedule first.
        targets: The requested target ideal speedups.
    """

    num_layers: int
    lengths: list[int]
    dense_loss: float
    profile: list[LayerImportance]
    ranking: list[int]
    candidates: list[Candidate]
    targets: list[float]

    @property
    def front(self) -> list[Candidate]:
        return pareto_front(self.candidates)

    def best(self, target: float, family: str | None = None) -> Candidate | None:
        return best_for_target(self.candidates, target, family)


# -- the whole calibration ---------------------------------------------------------------------------------------
def score_candidates(module: SkipLM, batches: Sequence[Mapping[str, Any]], families: Sequence[ScheduleFamily],
                     lengths: Sequence[int], progress: bool = True) -> list[Candidate]:
    """One teacher-forced pass over ``batches`` per candidate, with its realised cost over ``lengths``."""
    num_layers = decoder_parts(module.model).num_layers
    scored = []
    for family in tqdm(families, desc="calibrate", unit="schedule", disable=not progress):
        schedule = family.build(num_layers)
        mean_layers = mean_executed_layers(schedule, lengths)
        scored.append(Candidate(family, schedule_loss(module, batches, schedule), mean_layers,
                                num_layers / mean_layers))
    return scored


def generation_scores(module: SkipLM, batches: Sequence[Mapping[str, Any]], family: ScheduleFamily,
                      metric: str) -> dict[str, float]:
    """ROUGE-1/2/L or multi-reference BLEU of greedy generations under ``family`` on ``batches``."""
    from torchmetrics.text import ROUGEScore, SacreBLEUScore

    schedule = family.build(decoder_parts(module.model).num_layers)
    predictions, references = [], []
    for batch in batches:
        predictions += module.generate_text(batch["prompt_input_ids"], batch["prompt_attention_mask"], schedule)
        references += batch["references"]
    if metric == "bleu":
        return {"bleu": float(SacreBLEUScore()(predictions, references))}
    rouge = ROUGEScore(rouge_keys=("rouge1", "rouge2", "rougeL"))(predictions, [r[0] for r in references])
    return {key.removesuffix("_fmeasure"): float(v) for key, v in rouge.items() if key.endswith("_fmeasure")}


def calibrate(
    module: SkipLM,
    batches: Sequence[Mapping[str, Any]],
    targets: Sequence[float] = DEFAULT_TARGETS,
    families: Sequence[str] = SEARCHED_FAMILIES,
    grid: Grid | None = None,
    per_target: int = 2,
    tolerance: float = 0.1,
    generation_batches: Sequence[Mapping[str, Any]] = (),
    metric: str | None = None,
    progress: bool = True,
) -> Calibration:
    """Measure the importance profile and score candidate schedules on validation batches.

    Args:
        module: A :class:`~skiptrain.training.module.SkipLM` with its model loaded, in eval mode.
        batches: Validation batches (the data module's collated batches).
        targets: Target ideal speedups to choose a schedule for.
        families: Families to search for each target (when no ``grid`` is given).
        grid: ``{family: {parameter: [values]}}``: score every combination instead of searching.
        per_target: Configurations scored per family and target in the search.
        tolerance: Relative window above each target that the search scores.
        generation_batches: Batches with ``references`` on which the Pareto front is also decoded and scored.
        metric: ``rouge`` or ``bleu`` for ``generation_batches``.
        progress: Show progress bars.
    """
    num_layers = decoder_parts(module.model).num_layers
    CalibrationRequest(tuple(targets), tuple(families), grid).check_targets(num_layers)
    lengths = target_lengths(batches)
    if sum(lengths) == 0:
        raise DataError("the validation batches have no labelled target tokens: nothing to calibrate on")
    dense_loss = schedule_loss(module, batches, Dense().build(num_layers))
    profile = layer_importance(module, batches, dense_loss, progress)
    ranking = importance_ranking(profile)
    if grid:
        families_to_score = grid_candidates(grid, num_layers, ranking)
    else:
        families_to_score = search_candidates(families, targets, num_layers, lengths, ranking, per_target, tolerance)
    dense = Candidate(Dense(), dense_loss, float(num_layers), 1.0)
    candidates = [dense, *score_candidates(module, batches, families_to_score, lengths, progress)]
    if generation_batches and metric in ("rouge", "bleu"):
        front = pareto_front(candidates)
        for c in tqdm(front, desc="generation (Pareto front)", unit="schedule", disable=not progress):
            scores = generation_scores(module, generation_batches, c.family, metric)
            candidates[candidates.index(c)] = Candidate(c.family, c.loss, c.mean_layers, c.ideal_speedup, scores)
    return Calibration(num_layers, lengths, dense_loss, profile, ranking, candidates, list(targets))


__all__ = [
    "Calibration",
    "CalibrationRequest",
    "Candidate",
    "LayerImportance",
    "SEARCHED_FAMILIES",
    "best_for_target",
    "calibrate",
    "family_space",
    "grid_candidates",
    "highest_speedup",
    "importance_ranking",
    "layer_importance",
    "pareto_front",
    "read_grid",
    "schedule_loss",
    "search_candidates",
    "target_lengths",
    "validation_batches",
]
