"""``skiptrain generate`` from a loaded model: one checked request, read straight down.

:func:`run_request` reads the request's prompts (:mod:`skiptrain.frontends.prompts`), fits them to the context,
decodes them (:func:`generate_report`: the decode driver of :mod:`skiptrain.frontends.decode`, then the speed
report of :mod:`skiptrain.frontends.speed`), writes the completions and says what it cost. This module needs no
data pipeline (``datasets``) and no training stack (Lightning).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torch import nn
from transformers import TextStreamer

from skiptrain.core import log
from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.frontends.decode import ON_CPU, Placement, complete
from skiptrain.frontends.prompts import RAW, STDIO, fit_prompts, read_prompts, write_completions
from skiptrain.frontends.request import GenerationRequest
from skiptrain.frontends.speed import GenerationReport, SpeculationReport, compare_speed, dense_step_seconds
from skiptrain.text.prompt_format import PromptFormat, Source

WARM_UP_TOKENS = 2


def generate_report(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    prompts: Sequence[Source],
    request: GenerationRequest,
    placement: Placement = ON_CPU,
    prompt_format: PromptFormat = RAW,
    streamer: TextStreamer | None = None,
) -> GenerationReport:
    """Complete ``prompts`` under ``schedule`` (every layer with ``request.dense``) after a short warm-up decode.

    With ``request.compare_dense`` the prompts are also timed under the schedule and densely at equal work
    (:func:`~skiptrain.frontends.speed.compare_speed`); with ``request.speculative`` (K >= 1) the output is the
    full-depth output, K tokens drafted under ``schedule`` per verification, reported with what was accepted and
    what it cost, and with ``compare_dense`` against full-depth decoding of the same prompts.
    """
    used = Dense().build(schedule.num_layers) if request.dense else schedule
    warm_up = dataclasses.replace(request, max_new_tokens=WARM_UP_TOKENS, speculative=min(request.speculative, 1))
    complete(model, tokenizer, used, prompts[:1], warm_up, placement=placement, prompt_format=prompt_format)
    completions, stats = complete(model, tokenizer, used, prompts, request, placement=placement,
                                  prompt_format=prompt_format, streamer=streamer)
    if not request.speculative:
        comparison = compare_speed(model, tokenizer, schedule, prompts, request, placement, prompt_format) \
            if request.compare_dense else None
        return GenerationReport(completions, used, stats, comparison)
    full_depth = None
    if request.compare_dense:
        dense = dataclasses.replace(request, speculative=0)
        full_depth = complete(model, tokenizer, Dense().build(schedule.num_layers), prompts, dense,
                              placement=placement, prompt_format=prompt_format)[1]
    step = dense_step_seconds(model, tokenizer, prompts, request, placement, prompt_format)
    return GenerationReport(completions, used, stats,
                            speculation=SpeculationReport(request.speculative, stats, step, full_depth))


def prepare_prompts(
    request: GenerationRequest, tokenizer: Any, context_length: int | None, prompt_format: PromptFormat = RAW,
) -> tuple[list[Source], PromptFormat]:
    """The request's prompts (its one ``prompt``, or those of its ``prompts`` file) fitted to ``context_length``,
    and the prompt format to make them with: cheap, so that a bad prompt is refused before any weights load."""
    prompts = [request.prompt] if request.prompt is not None else read_prompts(request.prompts)
    return fit_prompts(tokenizer, prompts, context_length, request.max_new_tokens, request.long_prompts,
                       prompt_format)


def run_request(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    request: GenerationRequest,
    prompts: Sequence[Source],
    placement: Placement = ON_CPU,
    prompt_format: PromptFormat = RAW,
) -> GenerationReport:
    """Do what ``request`` asks of a loaded model with its prepared ``prompts`` (:func:`prepare_prompts`): decode them
    under ``schedule`` (the draft schedule with ``speculative``), write the completions to ``request.output`` and say
    the summary on stderr.

    A single ``prompt`` is streamed to stdout as it is generated (transformers' ``TextStreamer``); its JSON line goes
    to ``request.output`` unless that is stdout.
    """
    streams = request.prompt is not None
    streamer = TextStreamer(tokenizer, skip_special_tokens=True) if streams and not request.speculative else None
    report = generate_report(model, tokenizer, schedule, prompts, request, placement, prompt_format, streamer)
    if streams and streamer is None:  # speculative decoding streams nothing: its text at the end
        print(report.completions[0].completion, flush=True)
    if not streams or request.output != STDIO:
        write_completions(report.completions, request.output)
    log.info(report.summary())  # stderr: stdout may carry the JSON lines
    return report


__all__ = ["WARM_UP_TOKENS", "generate_report", "prepare_prompts", "run_request"]
