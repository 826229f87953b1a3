"""The decode driver: a :class:`~skiptrain.frontends.request.GenerationRequest`'s prompts completed in batches by the
skip-aware front-end, and what it cost.

Each batch (:func:`~skiptrain.frontends.prompts.prompt_batches`) is decoded by
:func:`~skiptrain.modeling.generation.generate_under_schedule`, or with ``speculative`` by
:func:`~skiptrain.frontends.speculative.generate_lossless`, inside a fresh ``decoder.context()`` (e.g. the
precision's autocast). The cost is :class:`DecodeStats`: wall time, and the mean executed decoder layers and ideal
speedup over the tokens actually generated (:mod:`skiptrain.core.speedup`). Speculative decoding says once, after
its first batch, when that batch's acceptance and draft cost (against a few full-depth steps of the same batch) make
it slower than full depth (:func:`warn_unless_speculation_pays`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import StoppingCriteriaList, StopStringCriteria
from transformers.generation.streamers import BaseStreamer

from skiptrain.core import log
from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.core.speedup import batch_ideal_speedup, mean_executed_layers
from skiptrain.export.format import read_draft_vocab
from skiptrain.frontends.prompts import RAW, Completion, prompt_batches, prompt_text
from skiptrain.frontends.request import GenerationRequest
from skiptrain.frontends.speculative import StepSeconds, generate_lossless
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.generation import generate_under_schedule
from skiptrain.shipped.prompt_format import PromptFormat, PromptSource
from skiptrain.shipped.speculate import SpeculationStats, speedup_bound

DENSE_STEP_TOKENS = 16
"""Full-depth steps timed to measure a draft step's relative cost (``--speculative``)."""

@dataclass(frozen=True)
class Decoder:
    """A loaded causal LM ready to decode prompts: its tokenizer, the prompt format that makes prompt ids from the
    given prompts, its ``device``, and the ``context`` each decoding call runs in (e.g. the precision's autocast)."""

    model: nn.Module
    tokenizer: Any
    prompt_format: PromptFormat = RAW
    device: torch.device | str = "cpu"
    context: Callable[[], AbstractContextManager] = nullcontext

    def batches(self, prompts: Sequence[PromptSource], batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(input_ids, attention_mask)`` of each batch of ``prompts``, left-padded, on the device
        (:func:`~skiptrain.frontends.prompts.prompt_batches`)."""
        for batch in prompt_batches(self.tokenizer, prompts, batch_size, self.prompt_format):
            yield batch["prompt_input_ids"].to(self.device), batch["prompt_attention_mask"].to(self.device)

    def synchronize(self) -> None:
        """Wait for the device's queued work (CUDA), so that wall time counts it."""
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass(frozen=True)
class DecodeStats:
    """Cost of decoding a set of prompts under one schedule.

    Args:
        schedule: The schedule the prompts were decoded with (the draft schedule of speculative decoding).
        lengths: Tokens generated per prompt.
        seconds: Wall time of the decoding calls.
        speculation: With speculative decoding, what was drafted and accepted over all batches.
        step_seconds: With speculative decoding, the wall time per kind of forward call.
        full_depth_step_seconds: With speculative decoding, a full-depth step's wall time over the batch the
            speedup warning judged (:func:`full_depth_step_seconds`), ``None`` where none was timed.
    """

    schedule: SkipSchedule
    lengths: tuple[int, ...]
    seconds: float
    speculation: SpeculationStats | None = None
    step_seconds: StepSeconds | None = None
    full_depth_step_seconds: float | None = None

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
        return batch_ideal_speedup(self.schedule, self.lengths)


def complete(
    decoder: Decoder,
    schedule: SkipSchedule,
    prompts: Sequence[PromptSource],
    request: GenerationRequest,
    *,
    stop_at_eos: bool = True,
    streamer: BaseStreamer | None = None,
    advise: bool = True,
) -> tuple[list[Completion], DecodeStats]:
    """Complete ``prompts`` under ``schedule`` as ``request`` asks: its ``max_new_tokens``, ``batch_size``,
    ``sampling``, ``speculative`` draft length (with its ``draft_vocab`` and ``draft_confidence``) and ``stop``
    strings.

    With ``stop_at_eos=False`` every prompt gets ``max_new_tokens`` tokens (equal work, for timing); a ``streamer``
    receives the tokens of a one-prompt batch as they are generated. With ``advise`` speculative decoding warns once,
    after the first batch that judged drafts, if it does not pay (:func:`warn_unless_speculation_pays`).

    Returns:
        The completions in prompt order, and the decoding cost (wall time of the decoding calls only).
    """
    tokenizer = decoder.tokenizer
    completions: list[Completion] = []
    seconds, speculation, step_seconds = 0.0, SpeculationStats(), StepSeconds()
    eos = tokenizer.eos_token_id if stop_at_eos else None
    stopping = StoppingCriteriaList([StopStringCriteria(tokenizer, list(request.stop))]) if request.stop else None
    advised, dense_step = not (advise and request.speculative), None
    vocab = torch.tensor(read_draft_vocab(request.draft_vocab)) if request.draft_vocab and request.speculative \
        else None
    for ids, mask in decoder.batches(prompts, request.batch_size):
        started = time.perf_counter()
        with decoder.context():
            if request.speculative:
                out = generate_lossless(decoder.model, ids, mask, schedule, request.max_new_tokens,
                                        request.speculative, request.sampling, eos, tokenizer.pad_token_id,
                                        draft_vocab=vocab, draft_confidence=request.draft_confidence)
                speculation, step_seconds = speculation.add(out.stats), step_seconds.add(out.seconds)
            else:
                out = generate_under_schedule(decoder.model, ids, mask, schedule, request.max_new_tokens,
                                              request.sampling, eos, tokenizer.pad_token_id, streamer=streamer,
                                              stopping_criteria=stopping)
        decoder.synchronize()
        seconds += time.perf_counter() - started
        if not advised:  # a full-depth step of this batch, timed outside the decode's cost
            dense_step = full_depth_step_seconds(decoder, ids, mask, request)
            advised = warn_unless_speculation_pays(out.stats, out.seconds, request.speculative,
                                                   dense_step) is not None
        rows = zip(out.tokens.tolist(), out.lengths.tolist(), out.texts(tokenizer), strict=True)
        for row, n, text in rows:
            completions.append(Completion(prompt_text(prompts[len(completions)]), text, n, row[:n]))  # in order
    stats = DecodeStats(schedule, tuple(c.num_tokens for c in completions), seconds,
                        *((speculation, step_seconds, dense_step) if request.speculative else ()))
    return completions, stats


def full_depth_step_seconds(decoder: Decoder, ids: torch.Tensor, mask: torch.Tensor, request: GenerationRequest
                            ) -> float:
    """Wall time of one full-depth decode step over the batch ``ids`` (end-of-sequence ignored), at most
    :data:`DENSE_STEP_TOKENS` steps timed: speculative decoding without drafts, whose every verification is one
    full-depth column."""
    steps = max(min(request.max_new_tokens, DENSE_STEP_TOKENS), 2)
    with decoder.context():
        out = generate_lossless(decoder.model, ids, mask, Dense().build(decoder_parts(decoder.model).num_layers),
                                steps, 0, request.sampling, None, decoder.tokenizer.pad_token_id)
    decoder.synchronize()
    return out.seconds.verify / out.stats.verifications


def warn_unless_speculation_pays(speculation: SpeculationStats, seconds: StepSeconds, draft_tokens: int,
                                 dense_step_seconds: float) -> float | None:
    """Warn in one line when one speculative decode's acceptance ``a``, draft cost ``c`` and verification cost ``v``
    (its mean draft step and verification over ``dense_step_seconds``, a full-depth step's wall time) put the
    speedup bound (:func:`~skiptrain.shipped.speculate.speedup_bound`, the one generate's report prints) below 1.0x,
    saying what to do; return that bound, or ``None`` when the decode judged no drafts.
    """
    if not speculation.judged:
        return None
    cost = seconds.draft / speculation.draft_steps / dense_step_seconds if speculation.draft_steps else 0.0
    verify = seconds.verify / speculation.verifications / dense_step_seconds
    acceptance = speculation.acceptance_rate
    bound = speedup_bound(acceptance, draft_tokens, cost, verify)
    if bound < 1.0:
        log.warn(f"speculative={draft_tokens} is slower than full-depth decoding on this model: its first batch "
                 f"accepted a = {acceptance:.2f} of the drafts, a draft step cost c = {cost:.2f} and a verification "
                 f"v = {verify:.2f} full-depth steps, so the speedup is at most (1 - a^(K+1)) / ((1 - a)(K c + v)) "
                 f"= {bound:.2f}x; train the draft with the joint objective (--model.dense_loss_weight 1.0), draft "
                 "over a pruned vocabulary (export --draft_vocab_size N), use a smaller --speculative or a draft "
                 "schedule with fewer layers (--draft_schedule), or decode without --speculative")
    return bound


__all__ = ["DENSE_STEP_TOKENS", "DecodeStats", "Decoder", "complete", "full_depth_step_seconds",
           "warn_unless_speculation_pays"]
