"""Batched completion of raw prompts with the skip-aware front-end, and what it costs (``skiptrain generate``).

Prompts are read (:func:`read_prompts`), made into prompt ids by the run's prompt format as training made them
(:class:`~skiptrain.text.prompt_format.PromptFormat`; raw prompts are used as given), left-padded per batch by the
batch contract (:func:`~skiptrain.text.batch.collate_prompts`) and decoded by
:func:`~skiptrain.modeling.generation.generate`. The cost is reported in :class:`DecodeStats`: wall time, and the mean
executed decoder layers and ideal speedup over the tokens actually generated (:mod:`skiptrain.core.speedup`). The
speed comparison with dense decoding
(:class:`SpeedComparison`) times both at equal work, every prompt decoded for ``max_new_tokens`` tokens whatever
its end-of-sequence token, and holds the measured speedup against the parameter-read limit. This module needs no
data pipeline (``datasets``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.core.speedup import cost_summary, ideal_speedup, mean_executed_layers, parameter_read_speedup
from skiptrain.errors import PromptError, UsageError
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.generation import SamplingConfig, generate
from skiptrain.text.batch import collate_prompts
from skiptrain.text.encoding import tokenize_prompts
from skiptrain.text.prompt_format import PromptFormat, Source

STDIO = "-"
RAW = PromptFormat()
"""Prompts used as given (``--raw_prompts true``, or a model that records no prompt format)."""
WARM_UP_TOKENS = 2


# -- prompts ---------------------------------------------------------------------------------------------------------
def read_prompts(path: str, stdin: TextIO | None = None) -> list[Source]:
    """Prompts from a ``.jsonl`` file, a text file (one prompt per line) or stdin.

    A JSON line holds a ``prompt`` string (a bare source for the run's template, or the whole prompt with raw
    prompts) or, for a template of several fields, a ``template`` object of the field values, e.g.
    ``{"template": {"name": "The Eagle", "area": "riverside"}}``. Stdin (``path == "-"``) is read as JSON lines
    when its first non-blank line starts with ``{``, else as text.

    Raises:
        PromptError: for a missing or unreadable file, and naming the line of a malformed JSON line, a line without a
            string ``prompt`` or an object ``template``, or an empty prompt.
    """
    if path == STDIO:
        text, origin = (stdin or sys.stdin).read(), "stdin"
        as_json = text.lstrip().startswith("{")
    else:
        origin = f"prompts={path!r}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as err:
            raise PromptError(f"{origin}: no such file; give a .jsonl or text file of prompts, or - for stdin") from err
        except (OSError, UnicodeDecodeError) as err:
            raise PromptError(f"{origin} cannot be read as UTF-8 text ({err}): give a .jsonl or text file") from err
        as_json = Path(path).suffix.lower() in (".jsonl", ".json")
    prompts: list[Source] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompt: Source = line
        if as_json:
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptError(f"{origin} line {number}: not valid JSON: {err}") from err
            if isinstance(record, dict) and isinstance(record.get("template"), dict):
                prompt = {str(k): str(v) for k, v in record["template"].items()}
            elif isinstance(record, dict) and isinstance(record.get("prompt"), str):
                prompt = record["prompt"]
            else:
                raise PromptError(f"{origin} line {number}: expected an object with a string 'prompt' field or a "
                                  "'template' object of field values")
        if isinstance(prompt, str) and not prompt.strip():
            raise PromptError(f"{origin} line {number}: empty prompt")
        prompts.append(prompt)
    if not prompts:
        raise PromptError(f"{origin}: no prompts")
    return prompts


def prompt_text(prompt: Source) -> str:
    """A prompt as a line of text: a string as it is, the fields of a ``template`` object as their JSON object."""
    return prompt if isinstance(prompt, str) else json.dumps(dict(prompt), ensure_ascii=False)


LongPrompts = Literal["refuse", "truncate"]


def fit_prompts(
    tokenizer: Any, prompts: Sequence[Source], context_length: int | None, max_new_tokens: int,
    long_prompts: LongPrompts = "refuse", prompt_format: PromptFormat = RAW,
) -> tuple[list[Source], PromptFormat]:
    """Prompts, and the prompt format to make them with, that leave room for ``max_new_tokens`` in the model's
    ``context_length`` (``None``: no limit).

    A longer prompt is refused, or with ``long_prompts="truncate"`` shortened with a warning: a raw prompt to its last
    tokens that fit, a prompt made by a template by trimming its source further (the format's ``max_source_tokens``
    is lowered), never the template.

    Raises:
        UsageError: for ``max_new_tokens`` that alone fill the context.
        PromptError: naming the first prompt that does not fit (``long_prompts="refuse"``).
    """
    if context_length is None:
        return list(prompts), prompt_format
    budget = context_length - max_new_tokens
    if budget < 1:
        raise UsageError(f"max_new_tokens={max_new_tokens} is invalid for a model whose context length is "
                         f"{context_length} tokens: allowed 1 <= max_new_tokens < {context_length}")
    fitted = list(prompts)
    for number, ids in enumerate(prompt_format.encode(tokenizer, prompts)[1], start=1):
        if len(ids) <= budget:
            continue
        if long_prompts != "truncate":
            raise PromptError(
                f"prompt {number} has {len(ids)} tokens, and with max_new_tokens={max_new_tokens} it exceeds the "
                f"model's context length of {context_length} tokens: shorten it, lower --max_new_tokens, or pass "
                "--long_prompts truncate to keep its last tokens"
            )
        kept = "its last" if prompt_format.is_raw else "its source trimmed to"
        rank_zero_warn(f"skiptrain generate: prompt {number} has {len(ids)} tokens; truncated to {kept} {budget} or "
                       f"fewer so that max_new_tokens={max_new_tokens} fit the context of {context_length}")
        if prompt_format.is_raw:
            fitted[number - 1] = _prompt_tail(tokenizer, prompts[number - 1], budget)
        else:
            limit = min(prompt_format.max_source_tokens or budget, budget)
            prompt_format = dataclasses.replace(prompt_format, max_source_tokens=limit)
    return fitted, prompt_format


def _prompt_tail(tokenizer: Any, prompt: str, budget: int) -> str:
    """The longest tail of ``prompt`` (whole tokens) that tokenises to at most ``budget`` tokens."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    for cut in range(max(len(ids) - budget, 0), len(ids)):
        tail = tokenizer.decode(ids[cut:])
        if len(tokenize_prompts(tokenizer, [tail])[0]) <= budget:
            return tail
    raise PromptError(f"a prompt cannot be truncated to {budget} tokens")


def check_batch_size(batch_size: int) -> None:
    """Refuse a ``batch_size`` below 1 (before anything is loaded: :func:`prompt_batches` runs lazily)."""
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} is invalid: allowed >= 1")


def prompt_batches(tokenizer: Any, prompts: Sequence[Source], batch_size: int, prompt_format: PromptFormat = RAW
                   ) -> Iterator[dict[str, Any]]:
    """Batches of ``batch_size`` prompts made by ``prompt_format`` (raw by default), left-padded as training batches
    hold prompts.

    Raises:
        ValueError: If ``batch_size < 1``.
    """
    check_batch_size(batch_size)
    prompt_ids = prompt_format.encode(tokenizer, prompts)[1]
    for start in range(0, len(prompt_ids), batch_size):
        yield collate_prompts(prompt_ids[start:start + batch_size], tokenizer.pad_token_id)


# -- completions and their cost ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Completion:
    """One generated completion (a line of ``generate``'s JSON-lines output)."""

    prompt: str
    """The prompt as given: a source, a raw prompt, or the JSON object of a ``template`` line's fields."""
    completion: str
    num_tokens: int
    """Generated tokens, the end-of-sequence token included."""
    token_ids: list[int]
    """The generated token ids (``num_tokens`` of them)."""


@dataclass(frozen=True)
class DecodeStats:
    """Cost of decoding a set of prompts under one schedule.

    Args:
        schedule: The schedule the prompts were decoded with.
        lengths: Tokens generated per prompt.
        seconds: Wall time of the decoding calls.
    """

    schedule: SkipSchedule
    lengths: tuple[int, ...]
    seconds: float

    @property
    def num_tokens(self) -> int:
        """Generated tokens, over all prompts."""
        return sum(self.lengths)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else float("inf")

    @property
    def mean_layers_per_token(self) -> float:
        """Mean executed decoder layers per generated token, over the tokens generated."""
        return mean_executed_layers(self.schedule, self.lengths)

    @property
    def ideal_speedup(self) -> float:
        """Decoder layers / :attr:`mean_layers_per_token`, over the tokens generated (:mod:`skiptrain.core.speedup`)."""
        return ideal_speedup(self.schedule, self.lengths)


def complete(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    prompts: Sequence[Source],
    max_new_tokens: int,
    batch_size: int = 8,
    sampling: SamplingConfig | None = None,
    device: torch.device | str = "cpu",
    context: Callable[[], AbstractContextManager] = nullcontext,
    stop_at_eos: bool = True,
    prompt_format: PromptFormat = RAW,
) -> tuple[list[Completion], DecodeStats]:
    """Generate completions of ``prompts`` in batches of ``batch_size`` with the skip-aware front-end.

    Batches come from :func:`prompt_batches` (prompts made by ``prompt_format``); decoding is
    :func:`~skiptrain.modeling.generation.generate`, inside a fresh ``context()`` per batch (e.g. the precision
    plugin's autocast). With ``stop_at_eos=False`` every prompt gets
    ``max_new_tokens`` tokens (equal work, for timing).

    Returns:
        The completions in prompt order, and the decoding cost (wall time of the decoding calls only).
    """
    completions: list[Completion] = []
    seconds = 0.0
    for batch in prompt_batches(tokenizer, prompts, batch_size, prompt_format):
        started = time.perf_counter()
        with context():
            out = generate(model, batch["prompt_input_ids"].to(device), batch["prompt_attention_mask"].to(device),
                           schedule, max_new_tokens=max_new_tokens, sampling=sampling,
                           eos_token_id=tokenizer.eos_token_id if stop_at_eos else None,
                           pad_token_id=tokenizer.pad_token_id)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        seconds += time.perf_counter() - started
        rows = zip(out.tokens.tolist(), out.lengths.tolist(), out.texts(tokenizer), strict=True)
        for row, n, text in rows:
            completions.append(Completion(prompt_text(prompts[len(completions)]), text, n, row[:n]))  # in order
    return completions, DecodeStats(schedule, tuple(c.num_tokens for c in completions), seconds)


# -- the speed comparison --------------------------------------------------------------------------------------------
def parameter_counts(model: nn.Module) -> tuple[list[int], int]:
    """``(per decoder layer, LM head)`` parameter counts: what a decode step reads for each (see
    :func:`~skiptrain.core.speedup.parameter_read_speedup`)."""
    parts = decoder_parts(model)
    return [_num_parameters(layer) for layer in parts.layers], _num_parameters(parts.lm_head)


def _num_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@dataclass(frozen=True)
class SpeedComparison:
    """The same prompts decoded for the same number of tokens each, under the schedule and with every layer.

    Args:
        skip: Timing under the schedule.
        dense: Timing with every layer, the same tokens per prompt.
        parameter_read_limit: Dense parameters read per generated token over the schedule's, LM head included:
            the speedup a weight-read-bound decoder can reach.
    """

    skip: DecodeStats
    dense: DecodeStats
    parameter_read_limit: float

    @property
    def measured_speedup(self) -> float:
        """Dense wall time over wall time under the schedule (equal tokens, so also the tokens/s ratio)."""
        return self.dense.seconds / self.skip.seconds if self.skip.seconds > 0 else float("inf")

    def summary(self) -> str:
        lengths = self.skip.lengths
        return (
            f"equal work, {len(lengths)} prompts x {lengths[0]} tokens (end-of-sequence ignored): schedule "
            f"{self.skip.tokens_per_s:.1f} tokens/s, dense {self.dense.tokens_per_s:.1f} tokens/s; measured speedup "
            f"{self.measured_speedup:.2f}x, {self.measured_speedup / self.parameter_read_limit:.0%} of the "
            f"parameter-read limit {self.parameter_read_limit:.2f}x (LM head included; decoder layers alone "
            f"{self.skip.ideal_speedup:.2f}x)"
        )


def compare_speed(
    model: nn.Module, tokenizer: Any, schedule: SkipSchedule, prompts: Sequence[Source], max_new_tokens: int,
    **settings: Any,
) -> SpeedComparison:
    """Time ``prompts`` under ``schedule`` and densely, ``max_new_tokens`` tokens per prompt in both.

    Args:
        settings: ``batch_size``, ``sampling``, ``device``, ``context``, ``prompt_format`` of :func:`complete`.
    """
    skip, dense = (complete(model, tokenizer, used, prompts, max_new_tokens, stop_at_eos=False, **settings)[1]
                   for used in (schedule, Dense().build(schedule.num_layers)))
    limit = parameter_read_speedup(schedule, skip.lengths, *parameter_counts(model))
    return SpeedComparison(skip, dense, limit)


@dataclass(frozen=True)
class GenerationReport:
    """What ``skiptrain generate`` produced and measured."""

    completions: list[Completion]
    schedule: SkipSchedule
    """The schedule the completions were decoded with (dense with ``--dense``)."""
    stats: DecodeStats
    comparison: SpeedComparison | None = None
    """Equal-work timing under the schedule and dense (with ``--compare_dense``)."""

    def summary(self) -> str:
        lines = [
            f"skiptrain generate: {len(self.completions)} prompts, {self.stats.num_tokens} tokens in "
            f"{self.stats.seconds:.2f} s ({self.stats.tokens_per_s:.1f} tokens/s), schedule {self.schedule.family}: "
            + cost_summary(self.schedule, self.stats.lengths)
        ]
        if self.comparison is not None:
            lines.append(self.comparison.summary())
        return "\n".join(lines)


def generate_report(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    prompts: Sequence[Source],
    *,
    max_new_tokens: int,
    dense: bool = False,
    compare_dense: bool = False,
    **settings: Any,
) -> GenerationReport:
    """Complete ``prompts`` under ``schedule`` (every layer with ``dense``), after a short warm-up decode.

    Args:
        model: The causal LM, on its device.
        tokenizer: Its tokenizer (left-padding).
        schedule: The skip schedule.
        prompts: Raw prompts.
        max_new_tokens: Tokens generated per prompt at most.
        dense: Decode with every layer, ignoring the schedule.
        compare_dense: Also time the prompts under the schedule and densely at equal work (:func:`compare_speed`).
        settings: ``batch_size``, ``sampling``, ``device``, ``context``, ``prompt_format`` of :func:`complete`.
    """
    used = Dense().build(schedule.num_layers) if dense else schedule
    complete(model, tokenizer, used, prompts[:1], WARM_UP_TOKENS, **settings)
    completions, stats = complete(model, tokenizer, used, prompts, max_new_tokens, **settings)
    comparison = compare_speed(model, tokenizer, schedule, prompts, max_new_tokens, **settings) if compare_dense \
        else None
    return GenerationReport(completions, used, stats, comparison)


def write_completions(completions: Sequence[Completion], path: str, stdout: TextIO | None = None) -> None:
    """Write JSON lines (``prompt``, ``completion``, ``num_tokens``, ``token_ids``) to a file or stdout (``-``)."""
    text = "".join(json.dumps(asdict(c), ensure_ascii=False) + "\n" for c in completions)
    if path == STDIO:
        (stdout or sys.stdout).write(text)
        (stdout or sys.stdout).flush()
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


__all__ = [
    "STDIO",
    "Completion",
    "DecodeStats",
    "GenerationReport",
    "SpeedComparison",
    "check_batch_size",
    "compare_speed",
    "complete",
    "fit_prompts",
    "generate_report",
    "parameter_counts",
    "prompt_batches",
    "prompt_text",
    "read_prompts",
    "write_completions",
]
