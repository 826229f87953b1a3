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
  (:mod:`skiptrain.core.speedup`).

Which candidates are scored (a grid, or a search per target speedup), the Pareto front of loss against ideal speedup
and the choice per target are pure Python, in :mod:`skiptrain.core.candidates`.
:mod:`skiptrain.training.calibration_report` writes the results.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torchmetrics import MeanMetric
from tqdm.auto import tqdm

from skiptrain.core.candidates import (
    DEFAULT_TARGETS,
    SEARCHED_FAMILIES,
    CalibrationRequest,
    Candidate,
    Grid,
    best_for_target,
    grid_candidates,
    pareto_front,
    search_candidates,
)
from skiptrain.core.schedules import Dense, ScheduleFamily, SkipSchedule
from skiptrain.core.speedup import mean_executed_layers
from skiptrain.errors import DataError
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.forward import skip_hidden_states
from skiptrain.text.batch import IGNORE_INDEX
from skiptrain.training.losses import target_cross_entropy

if TYPE_CHECKING:
    from skiptrain.training.module import SkipLM


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
    "LayerImportance",
    "calibrate",
    "importance_ranking",
    "layer_importance",
    "schedule_loss",
    "target_lengths",
    "validation_batches",
]
