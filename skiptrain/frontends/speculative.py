"""Lossless self-speculative decoding: full-depth output, drafted under a skip schedule.

:func:`generate_lossless` takes what :func:`~skiptrain.modeling.generation.generate_under_schedule` takes plus
``draft_tokens`` (K) and a ``draft`` schedule (default: the model's own). Its tokens are exactly full-depth decoding's:
K tokens are drafted one column at a time through the batched KV-cached skip path, one full-depth forward over the K + 1
columns verifies them, and the greedy rule or the rejection rule of Leviathan et al. decides what is kept
(:func:`~skiptrain.shipped.speculate.speculate`, the loop the export's ``custom_generate`` runs too).

One KV cache serves draft and verification. A draft column writes keys and values only in the layers it runs, and
those of every layer above the first it skips differ from the full-depth ones (a skipped layer changes the hidden
states of every layer after it), so before verification every layer is cut back to the columns verified before
(:func:`~skiptrain.shipped.speculate.crop_cache`), and after it every layer holds full-depth keys and values for
every column. Each row keeps its own accepted tokens; its rejected columns become padding (attention mask 0), moved
before its tokens in every layer (:func:`~skiptrain.shipped.cache.compact_cache`), so rows never wait for each other
and a sliding attention window, counted in columns, covers a row's last tokens as in full-depth decoding (Gemma 2
and 3, Mistral and Qwen with a window).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.errors import UsageError
from skiptrain.modeling.architectures import DecoderParts, decoder_parts
from skiptrain.modeling.forward import skip_hidden_states
from skiptrain.modeling.generation import GenerationOutput, SamplingConfig
from skiptrain.shipped.cache import full_length_cache
from skiptrain.shipped.draft_head import DraftHead, draft_confidence_problem, draft_vocab_problem
from skiptrain.shipped.speculate import SpeculationStats, crop_cache, speculate


@dataclass
class StepSeconds:
    """Wall time spent in each kind of forward call of a speculative decode.

    Attributes:
        prefill: Prompt forwards.
        draft: Draft forwards (one column each).
        verify: Full-depth verification forwards.
    """

    prefill: float = 0.0
    draft: float = 0.0
    verify: float = 0.0

    def add(self, other: StepSeconds) -> StepSeconds:
        return StepSeconds(self.prefill + other.prefill, self.draft + other.draft, self.verify + other.verify)


@dataclass(frozen=True)
class SpeculativeOutput(GenerationOutput):
    """:class:`~skiptrain.modeling.generation.GenerationOutput` plus what the speculation accepted and cost.

    Args:
        stats: Verifications, drafts judged and accepted, tokens kept.
        seconds: Wall time per kind of forward call.
    """

    stats: SpeculationStats = field(default_factory=SpeculationStats)
    seconds: StepSeconds = field(default_factory=StepSeconds)


class SkipSteps:
    """The forward calls of :func:`~skiptrain.shipped.speculate.speculate` through the skip-aware forward, timed.

    Prompts run at full depth; a draft for generated index ``g`` runs ``draft.executed_layers(g)`` in every column
    of the call, whatever its position (after rejected columns, position and column differ), and scores the
    draft vocabulary alone when one is given (:class:`~skiptrain.shipped.draft_head.DraftHead`).

    Args:
        model: A supported Hugging Face causal LM (optionally peft-wrapped).
        draft: The draft schedule, built for the model's layer count (its prompt layers are not used).
        prompt_length: ``P``, where every left-padded prompt ends.
        draft_vocab: ``[N]`` token ids the drafts choose from (default: the whole vocabulary).
    """

    def __init__(self, model: nn.Module, draft: SkipSchedule, prompt_length: int,
                 draft_vocab: torch.Tensor | None = None) -> None:
        self.model, self.parts = model, decoder_parts(model)
        self.draft_head = None if draft_vocab is None else \
            DraftHead(self.parts.lm_head, draft_vocab, self.parts.model.config)
        draft.check_num_layers(self.parts.num_layers)
        self.draft_schedule, self.dense = draft, Dense().build(self.parts.num_layers)
        self._drafts: dict[tuple[int, ...], SkipSchedule] = {}
        self.prompt_length = prompt_length
        self.cache = full_length_cache(self.parts.model.config)
        self.seconds = StepSeconds()
        self._synchronize = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)

    def _logits(self, kind: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, schedule: SkipSchedule,
                last_only: bool, head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        started = time.perf_counter()
        parts: DecoderParts = self.parts
        hidden = skip_hidden_states(self.model, input_ids, attention_mask, schedule, self.prompt_length, self.cache,
                                    parts)
        logits = (head or parts.logits)(hidden[:, -1] if last_only else hidden).float()
        self._synchronize()
        setattr(self.seconds, kind, getattr(self.seconds, kind) + time.perf_counter() - started)
        return logits

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._logits("prefill", input_ids, attention_mask, self.dense, last_only=True)

    def draft(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, index: int) -> torch.Tensor:
        layers = self.draft_schedule.executed_layers(index)
        if layers not in self._drafts:  # whatever its column: rejected columns make column and index differ
            self._drafts[layers] = SkipSchedule(self.parts.num_layers, self.dense.prompt_layers, (layers,))
        return self._logits("draft", input_ids, attention_mask, self._drafts[layers], last_only=True,
                            head=self.draft_head)

    def verify(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past: int) -> torch.Tensor:
        crop_cache(self.cache, past)
        return self._logits("verify", input_ids, attention_mask, self.dense, last_only=False)


def check_draft_tokens(draft_tokens: int, max_new_tokens: int) -> None:
    """Refuse a draft length below 0 or above ``max_new_tokens``, naming both.

    Raises:
        UsageError: naming ``speculative`` and the allowed range.
    """
    if not 0 <= draft_tokens <= max_new_tokens:
        raise UsageError(f"speculative={draft_tokens} is invalid with max_new_tokens={max_new_tokens}: allowed "
                         f"0 <= speculative <= {max_new_tokens} draft tokens per verification (0 turns it off)")


def check_draft_levers(draft_vocab: torch.Tensor | None, draft_confidence: float, vocab_size: int) -> None:
    """Refuse a draft vocabulary that is not distinct ids of the model's ``vocab_size`` head, or a confidence
    threshold outside ``[0, 1)``.

    Raises:
        UsageError: naming ``draft_vocab`` or ``draft_confidence`` and what is allowed.
    """
    problem = draft_confidence_problem(draft_confidence)
    if problem is not None:
        raise UsageError(f"draft_confidence={draft_confidence!r} is invalid: {problem}")
    if draft_vocab is None:
        return
    problem = draft_vocab_problem(draft_vocab, vocab_size) if isinstance(draft_vocab, torch.Tensor) else \
        draft_vocab_problem(None, vocab_size)
    if problem is not None:
        shown = draft_vocab.tolist() if isinstance(draft_vocab, torch.Tensor) and draft_vocab.numel() <= 8 else \
            f"<{type(draft_vocab).__name__} of shape {tuple(getattr(draft_vocab, 'shape', ()))}>"
        raise UsageError(f"draft_vocab={shown} is invalid: {problem}")


def check_speculative_sampling(sampling: SamplingConfig) -> None:
    """Refuse ``sampling.block_repeated_ngrams`` for speculative decoding: its drafts and verification apply only
    the warpers that read no sequence."""
    if sampling.block_repeated_ngrams:
        raise UsageError(f"sampling.block_repeated_ngrams={sampling.block_repeated_ngrams} is invalid with "
                         "speculative decoding: allowed 0, or decode without speculation")


@torch.no_grad()
def generate_lossless(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    draft: SkipSchedule,
    max_new_tokens: int,
    draft_tokens: int,
    sampling: SamplingConfig | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int = 0,
    generator: torch.Generator | None = None,
    synced: bool = False,
    batch_minimum: bool = False,
    draft_vocab: torch.Tensor | None = None,
    draft_confidence: float = 0.0,
) -> SpeculativeOutput:
    """Full-depth decoding of left-padded prompts, ``draft_tokens`` tokens drafted per verification under ``draft``.

    Arguments as :func:`~skiptrain.modeling.generation.generate_under_schedule` (whose ``schedule`` here is the
    draft schedule), plus ``draft_tokens``, K >= 0 (0 decodes at full depth one token per step), and
    ``batch_minimum`` and ``draft_confidence`` (:func:`~skiptrain.shipped.speculate.speculate`: a row stops proposing
    drafts after one less probable than this), and ``draft_vocab``, ``[N]`` token ids the drafts choose from (their
    LM head scores those alone; verification scores the whole vocabulary). Greedy tokens equal
    ``generate_under_schedule(..., Dense().build(L))``'s up to logit near-ties (a K + 1 column matmul may round
    differently from a one-column one); sampled tokens follow its distribution.

    Raises:
        UsageError: for ``max_new_tokens < 1``, ``draft_tokens`` outside ``[0, max_new_tokens]``, ``synced=True``
            (the number of forward calls depends on what each rank accepts, so ranks of ZeRO-3 or FSDP would not
            call their layers in lockstep), ``sampling.block_repeated_ngrams`` (the verification applies only
            warpers that read no sequence), a ``draft_vocab`` that is not distinct ids of the vocabulary, or
            ``draft_confidence`` outside ``[0, 1)``.
    """
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens={max_new_tokens} is invalid: allowed >= 1")
    check_draft_tokens(draft_tokens, max_new_tokens)
    parts = decoder_parts(model)
    check_draft_levers(draft_vocab, draft_confidence, parts.lm_head.weight.shape[0])
    if synced:
        raise UsageError("synced=True is invalid with speculative decoding: its forward calls depend on what each "
                         "rank accepts; allowed synced=False (decode on one process, or without speculation)")
    sampling = sampling or SamplingConfig()
    check_speculative_sampling(sampling)
    steps = SkipSteps(model, draft, input_ids.shape[1], draft_vocab)
    tokens, lengths, stats = speculate(
        steps, input_ids, attention_mask, max_new_tokens, draft_tokens, eos_token_id, pad_token_id,
        do_sample=sampling.do_sample, warpers=sampling.warpers(), generator=generator, batch_minimum=batch_minimum,
        draft_confidence=draft_confidence,
    )
    return SpeculativeOutput(tokens=tokens, lengths=lengths, stats=stats, seconds=steps.seconds)


__all__ = ["SkipSteps", "SpeculativeOutput", "StepSeconds", "check_draft_levers", "check_draft_tokens",
           "check_speculative_sampling", "generate_lossless"]
