"""The speed report of ``skiptrain generate``: the schedule against dense decoding at equal work, and lossless
speculative decoding's acceptance and cost, each held against the limit it should reach.

:class:`SpeedComparison` times the same prompts under the schedule and densely, every prompt decoded for
``max_new_tokens`` tokens whatever its end-of-sequence token, and holds the measured speedup against the
parameter-read limit; :class:`SpeculationReport` holds speculative decoding against the bound its measured acceptance
and draft cost allow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.core.speedup import cost_summary, parameter_read_speedup
from skiptrain.frontends.decode import Decoder, DecodeStats, complete, full_depth_step_seconds
from skiptrain.frontends.prompts import Completion
from skiptrain.frontends.request import GenerationRequest
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.shipped.prompt_format import PromptSource
from skiptrain.shipped.speculate import speedup_bound


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


def compare_speed(decoder: Decoder, schedule: SkipSchedule, prompts: Sequence[PromptSource], request: GenerationRequest
                  ) -> SpeedComparison:
    """Time ``prompts`` under ``schedule`` and densely, ``request.max_new_tokens`` tokens per prompt in both."""
    skip, dense = (complete(decoder, used, prompts, request, stop_at_eos=False)[1]
                   for used in (schedule, Dense().build(schedule.num_layers)))
    limit = parameter_read_speedup(schedule, skip.lengths, *parameter_counts(decoder.model))
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
        """The speedup the measured acceptance, draft cost and verification cost allow (:func:`speedup_bound`)."""
        verify_cost = self.verify_cost if self.stats.speculation.verifications else 1.0  # none ran: the default
        return speedup_bound(self.acceptance, self.draft_tokens, self.draft_cost, verify_cost)

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
                f"(1 - a^(K+1)) / ((1 - a)(K c + v)) = {self.bound:.2f}x")
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


def dense_step_seconds(decoder: Decoder, prompts: Sequence[PromptSource], request: GenerationRequest) -> float:
    """Wall time of one full-depth decode step over the first batch of ``prompts``
    (:func:`~skiptrain.frontends.decode.full_depth_step_seconds`)."""
    return full_depth_step_seconds(decoder, *next(decoder.batches(prompts, request.batch_size)), request)


__all__ = ["GenerationReport", "SpeculationReport", "SpeedComparison", "compare_speed",
           "dense_step_seconds", "parameter_counts"]
