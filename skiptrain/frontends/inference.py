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

from transformers import TextStreamer

from skiptrain.core import log
from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.frontends.decode import Decoder, complete
from skiptrain.frontends.prompts import RAW, STDIO, fit_prompts, read_prompts, write_completions
from skiptrain.frontends.request import GenerationRequest
from skiptrain.frontends.speed import GenerationReport, SpeculationReport, compare_speed, dense_step_seconds
from skiptrain.shipped.prompt_format import PromptFormat, PromptSource

WARM_UP_TOKENS = 2


def generate_report(
    decoder: Decoder, schedule: SkipSchedule, prompts: Sequence[PromptSource], request: GenerationRequest,
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
    complete(decoder, used, prompts[:1], warm_up, advise=False)
    completions, stats = complete(decoder, used, prompts, request, streamer=streamer)
    if not request.speculative:
        comparison = compare_speed(decoder, schedule, prompts, request) if request.compare_dense else None
        return GenerationReport(completions, used, stats, comparison)
    full_depth = None
    if request.compare_dense:
        dense = dataclasses.replace(request, speculative=0)
        full_depth = complete(decoder, Dense().build(schedule.num_layers), prompts, dense)[1]
    step = stats.full_depth_step_seconds or dense_step_seconds(decoder, prompts, request)  # timed once at most
    return GenerationReport(completions, used, stats,
                            speculation=SpeculationReport(request.speculative, stats, step, full_depth))


def prepare_prompts(
    request: GenerationRequest, tokenizer: Any, context_length: int | None, prompt_format: PromptFormat = RAW,
) -> tuple[list[PromptSource], PromptFormat]:
    """The request's prompts (its one ``prompt``, or those of its ``prompts`` file) fitted to ``context_length``,
    and the prompt format to make them with: cheap, so that a bad prompt is refused before any weights load."""
    prompts = [request.prompt] if request.prompt is not None else read_prompts(request.prompts)
    return fit_prompts(tokenizer, prompts, context_length, request.max_new_tokens, request.long_prompts,
                       prompt_format)


def run_request(decoder: Decoder, schedule: SkipSchedule, request: GenerationRequest, prompts: Sequence[PromptSource]
                ) -> GenerationReport:
    """Do what ``request`` asks of a loaded model with its prepared ``prompts`` (:func:`prepare_prompts`, whose
    prompt format ``decoder`` makes them with): decode them under ``schedule`` (the draft schedule with
    ``speculative``), write the completions to ``request.output`` and say the summary on stderr.

    A single ``prompt`` is streamed to stdout as it is generated (transformers' ``TextStreamer``); its JSON line goes
    to ``request.output`` unless that is stdout.
    """
    streams = request.prompt is not None
    streamer = TextStreamer(decoder.tokenizer, skip_special_tokens=True) \
        if streams and not request.speculative else None
    report = generate_report(decoder, schedule, prompts, request, streamer)
    if streams and streamer is None:  # speculative decoding streams nothing: its text at the end
        print(report.completions[0].completion, flush=True)
    if not streams or request.output != STDIO:
        write_completions(report.completions, request.output)
    log.info(report.summary())  # stderr: stdout may carry the JSON lines
    return report


__all__ = ["WARM_UP_TOKENS", "generate_report", "prepare_prompts", "run_request"]
