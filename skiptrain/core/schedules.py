"""Position-dependent layer-skip schedules (pure Python, no torch).

A schedule says which decoder layers run for each sequence position (see ``docs/method.md``): prompt columns
run ``prompt_layers``; the token at generated index ``g`` (column ``P + g`` of a batch whose prompts are
left-padded to end at column ``P``) runs ``executed_layers(g)``. Executed sets
never grow along the sequence (the *nesting invariant*), so every layer a later token runs was run by all
earlier tokens and its keys/values are already in the KV cache.

Families are small frozen dataclasses holding their configured parameters (what a recipe writes);
:meth:`ScheduleFamily.build` turns one into a :class:`SkipSchedule` for a model with ``num_layers``
decoder layers. A :class:`SkipSchedule` is the materialised, validated table of layer sets: exactly the
``skip_schedule.json`` export contract, and what the forward pass and the decoder consume.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

from skiptrain.errors import UsageError

FORMAT = "skiptrain.skip_schedule"
SCHEMA_VERSION = 1
POSITION = "generated_index"

PromptDepth = Literal["all", "max"]


class ScheduleError(UsageError):
    """A schedule parameter or a serialised schedule is invalid."""


def _require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ScheduleError(f"{name}={value!r} is invalid: allowed {allowed}")


@dataclass(frozen=True)
class SkipSchedule:
    """A materialised, validated skip schedule for a model with ``num_layers`` decoder layers.

    Args:
        num_layers: Number of decoder layers of the model the schedule is for.
        prompt_layers: Layers run by every prompt column, ascending.
        executed_layers: Entry ``g`` holds the layers run by the token at generated index ``g``, ascending;
            indices past the end use the last entry.
        family: Name of the family that built the schedule (``skipdecode``, ``ranked``, ``hierarchical``,
            ``static``, ``dense``), or ``explicit`` for one given only as layer lists.
        params: The family's parameters as configured (for the export's ``params`` key).
    """

    num_layers: int
    prompt_layers: tuple[int, ...]
    executed_layers_table: tuple[tuple[int, ...], ...]
    family: str = "explicit"
    params: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        n = self.num_layers
        _require(isinstance(n, int) and n >= 1, "num_layers", n, "an integer >= 1")
        _require(len(self.executed_layers_table) >= 1, "executed_layers", [], "at least one entry")
        sets = [("prompt_layers", self.prompt_layers)]
        sets += [(f"executed_layers[{g}]", s) for g, s in enumerate(self.executed_layers_table)]
        for name, layers in sets:
            _require(list(layers) == sorted(set(layers)), name, list(layers), "strictly ascending layer indices")
            _require(all(0 <= i < n for i in layers), name, list(layers), f"layer indices in [0, {n - 1}]")
            _require(0 in layers, name, list(layers), "a set containing layer 0 (the cache length is read from it)")
        previous_name, previous = sets[0]
        for name, layers in sets[1:]:
            extra = sorted(set(layers) - set(previous))
            _require(not extra, name, list(layers), f"a subset of {previous_name} (nesting); extra layers {extra}")
            previous_name, previous = name, layers

    # -- the schedule ---------------------------------------------------------------------------------------
    @property
    def span(self) -> int:
        """Number of materialised generated indices; ``executed_layers(g)`` is constant for ``g >= span - 1``."""
        return len(self.executed_layers_table)

    def executed_layers(self, g: int) -> tuple[int, ...]:
        """Layers run by the token at generated index ``g`` (``g >= 0``)."""
        if g < 0:
            raise ScheduleError(f"g={g} is invalid: allowed generated indices >= 0")
        return self.executed_layers_table[min(g, self.span - 1)]

    def materialize(self, length: int | None = None) -> list[tuple[int, ...]]:
        """Executed sets for generated indices ``0 .. length - 1`` (default: the schedule's span)."""
        length = self.span if length is None else length
        return [self.executed_layers(g) for g in range(length)]

    def layer_run_lengths(self, prompt_length: int, num_columns: int) -> list[int]:
        """For each layer, how many leading columns of a batch execute it.

        By the nesting invariant the columns that run layer ``l`` form a prefix ``[0, n_l)`` of a batch whose
        prompts end at column ``prompt_length``; this returns ``[n_0, ..., n_{L-1}]`` for ``num_columns``
        columns. A layer outside the prompt depth is run by no column.
        """
        if prompt_length < 0 or num_columns < prompt_length:
            raise ScheduleError(
                f"prompt_length={prompt_length} is invalid for {num_columns} columns: allowed 0 <= P <= columns"
            )
        generated = num_columns - prompt_length
        prompt, always = set(self.prompt_layers), set(self.executed_layers_table[-1])
        lengths = []
        for layer in range(self.num_layers):
            if layer not in prompt:
                lengths.append(0)
            elif layer in always:
                lengths.append(num_columns)
            else:
                stops = next(g for g, s in enumerate(self.executed_layers_table) if layer not in s)
                lengths.append(prompt_length + min(stops, generated))
        return lengths

    # -- derived quantities -----------------------------------------------------------------------------------
    def layers_run(self, generation_length: int) -> int:
        """Executed layers summed over generated indices ``0 .. generation_length - 1``."""
        return sum(len(s) for s in self.materialize(generation_length))

    def mean_layers_per_token(self, generation_length: int | None = None) -> float:
        """Mean number of executed layers per generated token over ``generation_length`` tokens (default span)."""
        length = self.span if generation_length is None else generation_length
        if length < 1:
            raise ScheduleError(f"generation_length={generation_length} is invalid: allowed >= 1")
        return self.layers_run(length) / length

    def sequence_ideal_speedup(self, generation_length: int | None = None) -> float:
        """Ideal decode speedup ``L / mean |E(g)|`` of one sequence of ``generation_length`` tokens (default: the span),
        decoder layers only; for rows of several lengths see :func:`~skiptrain.core.speedup.batch_ideal_speedup`."""
        return self.num_layers / self.mean_layers_per_token(generation_length)

    def layer_flop_fraction(self, prompt_length: int, generation_length: int) -> float:
        """Fraction of dense decoder-layer work spent on one example of the given prompt/generation lengths."""
        total = prompt_length + generation_length
        if total <= 0:
            raise ScheduleError("prompt_length + generation_length must be >= 1")
        executed = prompt_length * len(self.prompt_layers) + self.layers_run(generation_length)
        return executed / (total * self.num_layers)

    def check_num_layers(self, num_layers: int) -> None:
        """Refuse to apply this schedule to a model with a different number of decoder layers."""
        if num_layers != self.num_layers:
            raise ScheduleError(
                f"num_layers={self.num_layers} of the schedule does not match the model's {num_layers} decoder "
                f"layers: build the schedule for the model it is applied to"
            )

    def describe(self, generation_length: int | None = None) -> str:
        """A Markdown table of executed layers per generated index (runs of equal sets merged)."""
        rows = ["| generated index g | executed layers | count |", "|---|---|---|"]
        sets = self.materialize(max(generation_length or 0, self.span))
        start = 0
        for g in range(1, len(sets) + 1):
            if g == len(sets) or sets[g] != sets[start]:
                if g == len(sets):
                    label = f"{start}+"  # the last set stands for every later index
                else:
                    label = str(start) if g - 1 == start else f"{start}-{g - 1}"
                rows.append(f"| {label} | {_ranges(sets[start])} | {len(sets[start])} |")
                start = g
        return "\n".join([f"prompt columns run {_ranges(self.prompt_layers)} ({len(self.prompt_layers)} layers)", ""]
                         + rows)

    def picture(self, prompt_length: int = 4, generation_length: int | None = None) -> str:
        """Text picture of which layer (row, top layer first) runs at which column: ``#`` runs, ``.`` skips.

        Prompt columns come first, then generated indices ``0 .. generation_length - 1`` (default: the span).
        """
        length = self.span if generation_length is None else generation_length
        columns = [set(self.prompt_layers)] * prompt_length + [set(s) for s in self.materialize(length)]
        width = len(str(self.num_layers - 1))
        rows = [f"layer {layer:>{width}} " + "".join("#" if layer in c else "." for c in columns)
                for layer in reversed(range(self.num_layers))]
        axis = " " * (width + 7) + "P" * prompt_length + "".join(str(g % 10) for g in range(length))
        return "\n".join([*rows, axis])

    # -- serialisation ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The schedule keys of the export contract (``skip_schedule.json``)."""
        return {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "num_layers": self.num_layers,
            "family": self.family,
            "params": dict(self.params),
            "position": POSITION,
            "prompt_layers": list(self.prompt_layers),
            "executed_layers": [list(s) for s in self.executed_layers_table],
            "nested": True,
            "mean_layers_per_token": self.mean_layers_per_token(),
        }

    def to_json(self, **extra: Any) -> str:
        """JSON text of :meth:`to_dict` plus any ``extra`` export keys."""
        return json.dumps({**self.to_dict(), **extra}, indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SkipSchedule:
        """Rebuild a schedule from :meth:`to_dict` output, validating the contract.

        The layer lists are authoritative; when the family is known, its parameters must rebuild exactly
        the same lists (otherwise the file was edited inconsistently and is refused).
        """
        if not isinstance(data, dict):
            raise ScheduleError(f"skip schedule must be a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ScheduleError(f"format={data.get('format')!r} is invalid: allowed {FORMAT!r}")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ScheduleError(
                f"schema_version={data.get('schema_version')!r} is not supported: allowed {SCHEMA_VERSION}"
            )
        if data.get("position") != POSITION:
            raise ScheduleError(f"position={data.get('position')!r} is invalid: allowed {POSITION!r}")
        for key in ("num_layers", "family", "params", "prompt_layers", "executed_layers"):
            if key not in data:
                raise ScheduleError(f"skip schedule is missing the key {key!r}")
        try:
            schedule = cls(
                num_layers=data["num_layers"],
                prompt_layers=tuple(data["prompt_layers"]),
                executed_layers_table=tuple(tuple(s) for s in data["executed_layers"]),
                family=data["family"],
                params=dict(data["params"]),
            )
        except TypeError as err:
            raise ScheduleError(f"skip schedule has malformed layer lists: {err}") from err
        if schedule.family in FAMILIES:
            rebuilt = FAMILIES[schedule.family](**schedule.params).build(schedule.num_layers)
            if rebuilt != schedule:
                raise ScheduleError(
                    f"family={schedule.family!r} with params={schedule.params} does not rebuild the stored layer lists"
                )
        return schedule

    @classmethod
    def from_json(cls, text: str) -> SkipSchedule:
        """Parse :meth:`to_json` output."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ScheduleError(f"skip schedule is not valid JSON: {err}") from err
        return cls.from_dict(data)


def _ranges(layers: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    parts, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            parts.append(str(start) if start == layer else f"{start}-{layer}")
            start = None
    return ", ".join(parts)


# -- families ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScheduleFamily:
    """Base class of the configurable schedule families."""

    name: ClassVar[str]

    prompt_depth: PromptDepth = "all"
    """Layers run by prompt columns: ``all`` layers (default) or the schedule's ``max`` set, ``E(0)``."""

    def executed_sets(self, num_layers: int) -> list[tuple[int, ...]]:
        """Executed sets ``E(0), E(1), ...`` up to the first index after which they stay constant."""
        raise NotImplementedError

    def build(self, num_layers: int) -> SkipSchedule:
        """Validate the parameters against ``num_layers`` and materialise the schedule."""
        _require(isinstance(num_layers, int) and num_layers >= 1, "num_layers", num_layers, "an integer >= 1")
        _require(self.prompt_depth in ("all", "max"), "prompt_depth", self.prompt_depth, "'all' or 'max'")
        sets = self.executed_sets(num_layers)
        prompt = tuple(range(num_layers)) if self.prompt_depth == "all" else sets[0]
        return SkipSchedule(num_layers, prompt, tuple(sets), family=self.name, params=self.params())

    def params(self) -> dict[str, Any]:
        """The parameters as a recipe or ``skip_schedule.json`` writes them (lists, not tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class SkipDecode(ScheduleFamily):
    """SkipDecode linear decay (Del Corro et al., 2023, https://arxiv.org/abs/2307.02628).

    The token at generated index ``g`` runs ``n(g)`` layers: the bottom ``warmup_layers`` and the top
    ``n(g) - warmup_layers``, bypassing the block in between. ``n`` decays linearly from ``max_layers`` at
    ``g = 0`` to ``min_layers`` at ``g >= decay_tokens``, rounded down in exact integer arithmetic
    (``n(g) = max - floor((max - min) * g / T)``) so it never increases.
    """

    name: ClassVar[str] = "skipdecode"

    min_layers: int = 1
    """Executed layers per token at and after ``decay_tokens`` (warm-up included)."""
    max_layers: int | None = None
    """Executed layers for the first generated token (warm-up included); ``None`` means all layers."""
    warmup_layers: int = 1
    """Bottom layers every token runs (layer 0 must always run, so at least 1)."""
    decay_tokens: int = 128
    """Span ``T`` of the linear decay in generated tokens (near the median generation length)."""

    def layer_counts(self, num_layers: int) -> list[int]:
        """``n(g)`` for ``g = 0 .. decay_tokens``."""
        top = num_layers if self.max_layers is None else self.max_layers
        _require(1 <= self.warmup_layers < num_layers, "warmup_layers", self.warmup_layers,
                 f"1 <= warmup_layers < num_layers={num_layers} (layer 0 must run)")
        _require(self.warmup_layers < self.min_layers <= num_layers, "min_layers", self.min_layers,
                 f"warmup_layers={self.warmup_layers} < min_layers <= num_layers={num_layers} "
                 "(at least one top layer must run)")
        _require(self.min_layers <= top <= num_layers, "max_layers", self.max_layers,
                 f"min_layers={self.min_layers} <= max_layers <= num_layers={num_layers}")
        _require(isinstance(self.decay_tokens, int) and self.decay_tokens >= 1, "decay_tokens", self.decay_tokens,
                 "an integer >= 1")
        spread, span = top - self.min_layers, self.decay_tokens
        return [top - (spread * g) // span for g in range(span + 1)]

    def executed_sets(self, num_layers: int) -> list[tuple[int, ...]]:
        bottom = tuple(range(self.warmup_layers))
        return [bottom + tuple(range(num_layers - (n - self.warmup_layers), num_layers))
                for n in _trim_constant_tail(self.layer_counts(num_layers))]


@dataclass(frozen=True)
class Ranked(SkipDecode):
    """SkipDecode's linear decay of ``n(g)`` over a fixed ranking of the layers instead of the top block.

    The token at generated index ``g`` runs the bottom ``warmup_layers`` plus the first ``n(g) - warmup_layers``
    layers of ``ranking`` that are not warm-up layers, with ``n(g)`` exactly as in :class:`SkipDecode`. Every set
    is a prefix of one ranking, so the sets are nested by construction. ``ranking`` is a permutation of all
    layers, most important first (``skiptrain calibrate`` measures one); the position of a warm-up layer in it
    does not matter. With the ranking ``L-1, L-2, ..., 0`` this is SkipDecode itself.
    """

    name: ClassVar[str] = "ranked"

    ranking: tuple[int, ...] = ()
    """Every decoder layer once, most important first."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranking", tuple(self.ranking))

    def executed_sets(self, num_layers: int) -> list[tuple[int, ...]]:
        _require(sorted(self.ranking) == list(range(num_layers)), "ranking", list(self.ranking),
                 f"a permutation of the layers 0..{num_layers - 1} (each once, most important first)")
        bottom = tuple(range(self.warmup_layers))
        order = [layer for layer in self.ranking if layer >= self.warmup_layers]
        return [tuple(sorted(bottom + tuple(order[: n - self.warmup_layers])))
                for n in _trim_constant_tail(self.layer_counts(num_layers))]


@dataclass(frozen=True)
class Hierarchical(ScheduleFamily):
    """Hierarchical Skip Decoding, HSD (Zhu et al., 2024, https://arxiv.org/abs/2403.14919).

    Phase ``k`` runs the layers whose index is a multiple of ``2**k``, plus the warm-up layers and the last
    layer. Phase ``k`` starts at generated index ``phase_boundaries[k - 1]`` (phase 0, all layers, before the
    first boundary) and the level is capped at ``max_level``. Power-of-two strides keep the sets nested.
    """

    name: ClassVar[str] = "hierarchical"

    phase_boundaries: tuple[int, ...] = (0,)
    """Strictly increasing generated indices where the next phase starts (``0`` skips from the first token)."""
    max_level: int | None = None
    """Highest phase (stride ``2**max_level``); ``None`` means ``len(phase_boundaries)``."""
    warmup_layers: int = 1
    """Bottom layers every token runs (layer 0 must always run, so at least 1)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase_boundaries", tuple(self.phase_boundaries))

    def executed_sets(self, num_layers: int) -> list[tuple[int, ...]]:
        bounds = self.phase_boundaries
        _require(len(bounds) >= 1 and all(isinstance(b, int) and b >= 0 for b in bounds)
                 and list(bounds) == sorted(set(bounds)), "phase_boundaries", list(bounds),
                 "a non-empty, strictly increasing list of generated indices >= 0")
        level_cap = len(bounds) if self.max_level is None else self.max_level
        _require(1 <= level_cap <= len(bounds), "max_level", self.max_level,
                 f"1 <= max_level <= len(phase_boundaries)={len(bounds)}")
        _require(2**level_cap < num_layers, "max_level", level_cap,
                 f"a stride 2**max_level below num_layers={num_layers}")
        _require(1 <= self.warmup_layers < num_layers, "warmup_layers", self.warmup_layers,
                 f"1 <= warmup_layers < num_layers={num_layers} (layer 0 must run)")

        def level(g: int) -> int:
            return min(sum(1 for b in bounds if b <= g), level_cap)

        def layers(k: int) -> tuple[int, ...]:
            keep = {i for i in range(num_layers) if i % 2**k == 0}
            return tuple(sorted(keep | set(range(self.warmup_layers)) | {num_layers - 1}))

        return _trim_constant_tail([layers(level(g)) for g in range(bounds[level_cap - 1] + 1)])


@dataclass(frozen=True)
class Static(ScheduleFamily):
    """The same layers for every generated token: depth pruning / Unified Layer Skipping baseline
    (Liu et al., 2024, https://arxiv.org/abs/2404.06954).

    Give either an explicit ``layers`` list (must contain layer 0) or a ``depth``: the warm-up layer 0 plus
    the top ``depth - 1`` layers, i.e. SkipDecode's bypass at a constant depth.
    """

    name: ClassVar[str] = "static"

    layers: tuple[int, ...] | None = None
    """Explicit executed layers (ascending, containing 0)."""
    depth: int | None = None
    """Number of executed layers (layer 0 and the top ``depth - 1``)."""

    def __post_init__(self) -> None:
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))

    def executed_sets(self, num_layers: int) -> list[tuple[int, ...]]:
        _require((self.layers is None) != (self.depth is None), "layers/depth", (self.layers, self.depth),
                 "exactly one of layers or depth")
        if self.layers is not None:
            return [self.layers]
        _require(2 <= self.depth <= num_layers, "depth", self.depth, f"2 <= depth <= num_layers={num_layers}")
        return [(0, *range(num_layers - self.depth + 1, num_layers))]


@dataclass(frozen=True)
class Dense(ScheduleFamily):
    """Every layer for every token (the ordinary model)."""

    name: ClassVar[str] = "dense"

    def executed_sets(self, num_layers: int) -> list[tuple[int, ...]]:
        return [tuple(range(num_layers))]


FAMILIES: dict[str, type[ScheduleFamily]] = {f.name: f for f in (SkipDecode, Ranked, Hierarchical, Static, Dense)}


def _trim_constant_tail(items: list) -> list:
    """Drop trailing repeats: the last entry stands for every later index."""
    end = len(items)
    while end > 1 and items[end - 1] == items[end - 2]:
        end -= 1
    return items[:end]

