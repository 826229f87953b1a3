"""Batched completion of raw prompts with the skip-aware front-end, and what it costs (``skiptrain generate``).

Prompts are read (:func:`read_prompts`), made into prompt ids by the run's prompt format as training made them
(:class:`~skiptrain.shipped.prompt_format.PromptFormat`; raw prompts are used as given), left-padded per batch by the
batch contract (:func:`~skiptrain.text.batch.collate_prompts`) and decoded by
:func:`~skiptrain.modeling.generation.generate_under_schedule`. The cost is reported in :class:`DecodeStats`: wall
time, and the mean executed decoder layers and ideal speedup over the tokens actually generated
(:mod:`skiptrain.core.speedup`). The speed comparison with dense decoding
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
from skiptrain.frontends.speculative import StepSeconds, generate_lossless
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.generation import SamplingConfig, generate_under_schedule
from skiptrain.shipped.prompt_format import PromptFormat
from skiptrain.shipped.prompt_format import PromptSource as Source
from skiptrain.shipped.speculate import SpeculationStats, speedup_bound
from skiptrain.text.batch import collate_prompts
from skiptrain.text.encoding import tokenize_prompts

STDIO = "-"
RAW = PromptFormat()
"""Prompts used as given (``--raw_prompts true``, or a model that records no prompt format)."""
WARM_UP_TOKENS = 2
DENSE_STEP_TOKENS = 16
"""Full-depth steps timed to measure a draft step's relative cost (``--speculative``)."""


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
        schedule: The schedule the prompts were decoded with (the draft schedule of speculative decoding).
        lengths: Tokens generated per prompt.
        seconds: Wall time of the decoding calls.
        speculation: With speculative decoding, what was drafted and accepted over all batches.
        step_seconds: With speculative decoding, the wall time per kind of forward call.
    """

    schedule: SkipSchedule
    lengths: tuple[int, ...]
    seconds: float
    speculation: SpeculationStats | None = None
    step_seconds: StepSeconds | None = None

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
    speculative: int = 0,
    prompt_format: PromptFormat = RAW,
) -> tuple[list[Completion], DecodeStats]:
    """Generate completions of ``prompts`` in batches of ``batch_size`` with the skip-aware front-end.

    Batches come from :func:`prompt_batches` (prompts made by ``prompt_format``); decoding is
    :func:`~skiptrain.modeling.generation.generate_under_schedule`, inside a fresh ``context()`` per batch (e.g. the
    precision plugin's autocast). With ``stop_at_eos=False`` every prompt gets
    ``max_new_tokens`` tokens (equal work, for timing).

    Returns:
        The completions in prompt order, and the decoding cost (wall time of the decoding calls only).
    """
    completions: list[Completion] = []
    seconds, speculation, step_seconds = 0.0, SpeculationStats(), StepSeconds()
    for batch in prompt_batches(tokenizer, prompts, batch_size, prompt_format):
        ids, mask = batch["prompt_input_ids"].to(device), batch["prompt_attention_mask"].to(device)
        settings = dict(max_new_tokens=max_new_tokens, sampling=sampling, pad_token_id=tokenizer.pad_token_id,
                        eos_token_id=tokenizer.eos_token_id if stop_at_eos else None)
        started = time.perf_counter()
        with context():
            if speculative:
                out = generate_lossless(model, ids, mask, schedule, draft_tokens=speculative, **settings)
                speculation, step_seconds = speculation.add(out.stats), step_seconds.add(out.seconds)
            else:
                out = generate_under_schedule(model, ids, mask, schedule, **settings)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        seconds += time.perf_counter() - started
        rows = zip(out.tokens.tolist(), out.lengths.tolist(), out.texts(tokenizer), strict=True)
        for row, n, text in rows:
            completions.append(Completion(prompt_text(prompts[len(completions)]), text, n, row[:n]))  # in order
    stats = DecodeStats(schedule, tuple(c.num_tokens for c in completions), seconds,
                        *((speculation, step_seconds) if speculative else ()))
    return completions, stats


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
class SpeculationReport:
    """What lossless speculative decoding accepted and cost, against full-depth decoding.

    Args:
        draft_tokens: K, draft tokens per verification.
        stats: The speculative decode (its :attr:`DecodeStats.speculation` and step times set).
        dense_step_seconds: Wall time of one full-depth decode step at the same batch size.
        dense: Full-depth decoding of the same prompts, the same output (with ``--compare_dense``).
    """

    draft_tokens: int
    stats: DecodeStats
    dense_step_seconds: float
    dense: DecodeStats | None = None

    @property
    def acceptance(self) -> float:
        return self.stats.speculation.acceptance_rate

    @property
    def draft_cost(self) -> float:
        """``c``: a draft step's wall time over a full-depth step's."""
        steps = self.stats.speculation.draft_steps
        return self.stats.step_seconds.draft / steps / self.dense_step_seconds if steps else 0.0

    @property
    def verify_cost(self) -> float:
        """A verification's wall time (K + 1 columns at full depth) over a one-column full-depth step's."""
        return self.stats.step_seconds.verify / self.stats.speculation.verifications / self.dense_step_seconds

    @property
    def bound(self) -> float:
        """The speedup the measured acceptance and draft cost allow (:func:`speedup_bound`)."""
        return speedup_bound(self.acceptance, self.draft_tokens, self.draft_cost)

    @property
    def measured_speedup(self) -> float | None:
        """Full-depth wall time over speculative wall time, the same tokens (with ``--compare_dense``)."""
        return None if self.dense is None else self.dense.seconds / self.stats.seconds

    def summary(self) -> str:
        speculation = self.stats.speculation
        line = (f"lossless speculative decoding, {self.draft_tokens} draft tokens per verification: acceptance "
                f"{self.acceptance:.2f} ({speculation.accepted} of {speculation.judged} judged drafts), "
                f"{speculation.tokens_per_verification:.2f} tokens per verification, draft step "
                f"{self.draft_cost:.2f} of a full-depth step (verification {self.verify_cost:.2f}); bound "
                f"(1 - a^(K+1)) / ((1 - a)(K c + 1)) = {self.bound:.2f}x")
        if self.dense is not None:
            line += (f"; same output at full depth {self.dense.tokens_per_s:.1f} tokens/s: measured speedup "
                     f"{self.measured_speedup:.2f}x, {self.measured_speedup / self.bound:.0%} of the bound")
        return line


@dataclass(frozen=True)
class GenerationReport:
    """What ``skiptrain generate`` produced and measured."""

    completions: list[Completion]
    schedule: SkipSchedule
    """The schedule the completions were decoded with (dense with ``--dense``; the draft's with ``--speculative``)."""
    stats: DecodeStats
    comparison: SpeedComparison | None = None
    """Equal-work timing under the schedule and dense (with ``--compare_dense``, without ``--speculative``)."""
    speculation: SpeculationReport | None = None
    """Acceptance and cost of lossless speculative decoding (with ``--speculative``)."""

    def summary(self) -> str:
        cost = ("full-depth output, every token at " + f"{self.schedule.num_layers} decoder layers"
                if self.speculation is not None else cost_summary(self.schedule, self.stats.lengths))
        lines = [
            f"skiptrain generate: {len(self.completions)} prompts, {self.stats.num_tokens} tokens in "
            f"{self.stats.seconds:.2f} s ({self.stats.tokens_per_s:.1f} tokens/s), schedule {self.schedule.family}: "
            + cost
        ]
        lines += [part.summary() for part in (self.comparison, self.speculation) if part is not None]
        return "\n".join(lines)


def dense_step_seconds(
    model: nn.Module, tokenizer: Any, prompts: Sequence[Source], max_new_tokens: int, batch_size: int = 8,
    sampling: SamplingConfig | None = None, device: torch.device | str = "cpu",
    context: Callable[[], AbstractContextManager] = nullcontext, prompt_format: PromptFormat = RAW,
) -> float:
    """Wall time of one full-depth decode step over the first batch of ``prompts`` (end-of-sequence ignored), their
    prompts made by ``prompt_format``.

    Timed as speculative decoding without drafts, whose every verification is one full-depth column.
    """
    batch = next(prompt_batches(tokenizer, prompts, batch_size, prompt_format))
    ids, mask = batch["prompt_input_ids"].to(device), batch["prompt_attention_mask"].to(device)
    with context():
        out = generate_lossless(model, ids, mask, Dense().build(decoder_parts(model).num_layers),
                                max(max_new_tokens, 2), 0, sampling=sampling, pad_token_id=tokenizer.pad_token_id)
    return out.seconds.verify / out.stats.verifications


def generate_report(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    prompts: Sequence[Source],
    *,
    max_new_tokens: int,
    dense: bool = False,
    compare_dense: bool = False,
    speculative: int = 0,
    **settings: Any,
) -> GenerationReport:
    """Complete ``prompts`` under ``schedule`` (every layer with ``dense``), after a short warm-up decode.

    Args:
        model: The causal LM, on its device.
        tokenizer: Its tokenizer (left-padding).
        schedule: The skip schedule (with ``speculative``, the draft schedule).
        prompts: Raw prompts.
        max_new_tokens: Tokens generated per prompt at most.
        dense: Decode with every layer, ignoring the schedule.
        compare_dense: Also time the prompts under the schedule and densely at equal work (:func:`compare_speed`);
            with ``speculative``, decode them at full depth, the same output, and report the measured speedup.
        speculative: K >= 1: the full-depth output, K tokens drafted under ``schedule`` per verification, with
            what was accepted and what it cost (:class:`SpeculationReport`); 0: off.
        settings: ``batch_size``, ``sampling``, ``device``, ``context``, ``prompt_format`` of :func:`complete`.
    """
    used = Dense().build(schedule.num_layers) if dense else schedule
    complete(model, tokenizer, used, prompts[:1], WARM_UP_TOKENS, speculative=min(speculative, 1), **settings)
    completions, stats = complete(model, tokenizer, used, prompts, max_new_tokens, speculative=speculative, **settings)
    if not speculative:
        comparison = compare_speed(model, tokenizer, schedule, prompts, max_new_tokens, **settings) \
            if compare_dense else None
        return GenerationReport(completions, used, stats, comparison)
    full_depth = complete(model, tokenizer, Dense().build(schedule.num_layers), prompts, max_new_tokens,
                          **settings)[1] if compare_dense else None
    step = dense_step_seconds(model, tokenizer, prompts, min(max_new_tokens, DENSE_STEP_TOKENS), **settings)
    return GenerationReport(completions, used, stats, speculation=SpeculationReport(speculative, stats, step,
                                                                                     full_depth))


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
    "SpeculationReport",
    "SpeedComparison",
    "check_batch_size",
    "compare_speed",
    "complete",
    "dense_step_seconds",
    "fit_prompts",
    "generate_report",
    "parameter_counts",
    "prompt_batches",
    "prompt_text",
    "read_prompts",
    "write_completions",
]
