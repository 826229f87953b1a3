"""Lossless self-speculative decoding: exactly full-depth output, with the schedule only buying speed.

The schedule drafts K tokens one column at a time, one full-depth forward over those K + 1 columns verifies them,
and the longest agreeing prefix is kept (greedy), or the rejection rule of Leviathan et al. (arXiv 2211.17192)
decides (sampling), so the output distribution is the full-depth one. One KV cache serves both: before verification
every layer is cut back to the columns verified before, so afterwards it holds full-depth keys and values for every
column. A row's rejected columns then become padding and are moved before its tokens, in every layer
(:func:`~.cache.compact_cache`): each row stays left-padded, its tokens in the last columns, so a sliding attention
window counted in columns (Gemma 2 and 3, Mistral and Qwen with a window) covers exactly the tokens full-depth
decoding sees.

:func:`speculate` is the loop, over any :class:`SpeculativeSteps` (the forward calls on one cache): the export's
``generate(speculative_tokens=K)`` runs it through the gated transformers model, and skiptrain's own lossless
decoder (``skiptrain.frontends.speculative``) through skiptrain's skip-aware forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache, LogitsProcessorList

from .cache import compact_cache


class SpeculativeSteps(Protocol):
    """The forward calls :func:`speculate` makes, on one KV cache (logits as float32)."""

    cache: DynamicCache
    """The cache, every layer keeping every column (:func:`~.cache.full_length_cache`)."""

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts ``[B, P]`` at full depth into the empty cache; logits ``[B, V]`` of the first token."""

    def draft(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, index: int) -> torch.Tensor:
        """Run one column ``[B, 1]`` through the draft's layers for generated index ``index``; logits ``[B, V]``."""

    def verify(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past: int) -> torch.Tensor:
        """Cut every layer's cache to ``past`` columns, run ``[B, q]`` columns at full depth; logits ``[B, q, V]``."""


@dataclass
class SpeculationStats:
    """Counts of one speculative decode, over the rows still generating at each verification.

    Attributes:
        verifications: Full-depth verification forwards (all rows together).
        draft_steps: Draft forwards (one column each, all rows together).
        judged: Draft tokens the verifier judged: each row's proposed drafts up to and including its first rejected
            one.
        accepted: Draft tokens the verifier accepted.
        row_verifications: Verifications counted once per row still generating.
        committed: Tokens kept, over all rows and verifications.
        proposed: Draft tokens the rows proposed (all drafted ones, unless a draft-confidence threshold stopped a
            row early).
    """

    verifications: int = 0
    draft_steps: int = 0
    judged: int = 0
    accepted: int = 0
    row_verifications: int = 0
    committed: int = 0
    proposed: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted over judged drafts: the per-token acceptance probability ``a`` of Leviathan et al."""
        return self.accepted / self.judged if self.judged else 0.0

    @property
    def drafts_per_verification(self) -> float:
        """Draft tokens a row proposes per verification."""
        return self.proposed / self.row_verifications if self.row_verifications else 0.0

    @property
    def tokens_per_verification(self) -> float:
        """Tokens a row keeps per verification."""
        return self.committed / self.row_verifications if self.row_verifications else 0.0

    def add(self, other: SpeculationStats) -> SpeculationStats:
        """The counts of both decodes."""
        return SpeculationStats(*(getattr(self, name) + getattr(other, name) for name in vars(self)))


def speedup_bound(acceptance: float, draft_tokens: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    """``(1 - a^(K+1)) / ((1 - a)(K c + v))``: expected tokens per verification over its cost in full-depth steps.

    Args:
        acceptance: ``a``, the per-token acceptance probability.
        draft_tokens: ``K``, draft tokens per verification.
        draft_cost: ``c``, a draft step's cost relative to a full-depth step.
        verify_cost: ``v``, a verification's (``K + 1`` columns) cost relative to a full-depth step (one column):
            1 where columns are free (a step bound by reading the weights), more where the batch already fills the
            arithmetic (on a CPU, about 1.5 at batch 1 and 2 at batch 8 for a 135M model at K = 4).
    """
    tokens = draft_tokens + 1 if acceptance >= 1 else (1 - acceptance ** (draft_tokens + 1)) / (1 - acceptance)
    return tokens / (draft_tokens * draft_cost + verify_cost)


def greedy_acceptance(verified: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy rule: keep drafts while they equal the full-depth argmax.

    Args:
        verified: ``[B, k + 1, V]`` full-depth logits at the column before each draft, and after the last.
        drafts: ``[B, k]`` draft tokens.

    Returns:
        ``(tokens [B, k + 1], accepted [B])``: row ``b``'s exact tokens are ``tokens[b, :accepted[b] + 1]``.
    """
    tokens = verified.argmax(-1)  # [B, k + 1]
    accepted = (drafts == tokens[:, :-1]).long().cumprod(1).sum(1)  # [B]
    return tokens, accepted


def sampled_acceptance(
    verified: torch.Tensor, drafted: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator | None = None,
    proposed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection rule of Leviathan et al.: each token's distribution is the full-depth ``p``.

    Draft ``d ~ q`` is accepted with probability ``min(1, p(d) / q(d))``; the first rejected one is replaced by a
    sample of ``max(p - q, 0)`` (normalised), and when all are accepted one more token is sampled from ``p``. A
    draft that was not proposed is never accepted, and its column samples ``p`` (as after the last draft).

    Args:
        verified: ``[B, k + 1, V]`` full-depth probabilities ``p`` (after the logits warpers).
        drafted: ``[B, k, V]`` draft probabilities ``q`` the drafts were sampled from.
        drafts: ``[B, k]`` draft tokens.
        generator: Random generator.
        proposed: ``[B]`` drafts each row proposed (default: all ``k``); its later ones are not judged.

    Returns:
        As :func:`greedy_acceptance`.
    """
    batch, width, vocab = verified.shape
    if proposed is not None:  # q = 0 where a row proposed nothing: its residual there is p
        drafted = drafted * (torch.arange(width - 1, device=verified.device) < proposed[:, None])[..., None]
    p_draft = verified[:, :-1].gather(-1, drafts[..., None]).squeeze(-1)  # [B, k]
    q_draft = drafted.gather(-1, drafts[..., None]).squeeze(-1)  # [B, k]
    uniform = torch.rand(p_draft.shape, generator=generator, device=verified.device)
    accepted = (uniform * q_draft < p_draft).long().cumprod(1).sum(1)  # [B]
    if proposed is not None:
        accepted = accepted.minimum(proposed)
    residual = torch.cat([(verified[:, :-1] - drafted).clamp(min=0), verified[:, -1:]], dim=1)  # [B, k + 1, V]
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, verified)  # p == q: nothing to correct
    replaced = torch.multinomial(residual.reshape(-1, vocab), 1, generator=generator).view(batch, width)
    tokens = torch.cat([drafts, replaced[:, -1:]], dim=1)
    rows = torch.arange(batch, device=verified.device)
    tokens[rows, accepted] = replaced[rows, accepted]
    return tokens, accepted


@torch.no_grad()
def speculate(
    steps: SpeculativeSteps,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    draft_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int = 0,
    do_sample: bool = False,
    warpers: LogitsProcessorList | None = None,
    generator: torch.Generator | None = None,
    batch_minimum: bool = False,
    draft_confidence: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, SpeculationStats]:
    """Decode left-padded prompts: the full-depth output, drafted ``draft_tokens`` tokens per verification.

    All rows draft and verify the same columns, so one cache serves the batch; each row keeps its own exact tokens
    and its rejected columns become padding (attention mask 0) moved before its tokens, so a row's tokens are its
    full-depth tokens whatever the other rows accept. A row that ends leaves the batch (its cache rows are dropped):
    no later draft or verification computes anything for it. A draft column runs the draft's layers for the generated
    index of the row furthest behind (by nesting, a superset of every row's own). Rows end at an end-of-sequence token
    (then ``pad_token_id``) or at ``max_new_tokens``, as in transformers' ``generate`` and skiptrain's
    ``generate_under_schedule``.

    Args:
        steps: The forward calls on one cache (:class:`SpeculativeSteps`).
        input_ids: ``[B, P]`` prompts, left-padded.
        attention_mask: ``[B, P]``.
        max_new_tokens: Tokens per row at most.
        draft_tokens: ``K >= 0`` drafts per verification (0: full-depth decoding one token per step).
        eos_token_id: Token id(s) that end a row.
        pad_token_id: Filler after a row's end.
        do_sample: Sample (rejection rule) instead of greedy.
        warpers: transformers' logits warpers (temperature, top-k, top-p; they read no sequence), applied to draft
            and full depth alike.
        generator: Random generator for sampling.
        batch_minimum: Every row keeps only as many tokens as the row that keeps fewest (rows that end aside):
            also lossless, and slower; kept to measure what per-row bookkeeping buys.
        draft_confidence: A row stops proposing drafts in a round after one whose draft probability (after the
            warpers) is below this; the batch stops drafting once no active row proposes. 0: every row proposes
            all ``draft_tokens``.

    Returns:
        ``(tokens [B, G], lengths [B], stats)``.
    """
    device = input_ids.device
    eos = torch.tensor([] if eos_token_id is None else eos_token_id, device=device).flatten()
    batch, past = input_ids.shape
    prompt_length = past

    def probabilities(logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> warped softmax
        flat = logits.reshape(-1, logits.shape[-1])
        if warpers:
            flat = warpers(flat.new_zeros(len(flat), 0, dtype=torch.long), flat)
        return flat.softmax(-1).view(logits.shape)

    stats = SpeculationStats()
    first = steps.prefill(input_ids, attention_mask)
    token = torch.multinomial(probabilities(first), 1, generator=generator).squeeze(1) if do_sample \
        else first.argmax(-1)  # [B]
    tokens = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    tokens[:, 0] = token
    counts = torch.ones(batch, dtype=torch.long, device=device)  # tokens generated per row
    live, mask = torch.arange(batch, device=device), attention_mask  # rows still generating (the steps' batch)
    ones = torch.ones(batch, draft_tokens + 1, dtype=mask.dtype, device=device)
    done = torch.isin(token, eos) | (counts >= max_new_tokens)
    while True:
        if bool(done.any()):  # a finished row leaves the batch: no later call computes anything for it
            stay = (~done).nonzero().squeeze(1)
            if not len(stay):
                break
            live, mask, token = live[stay], mask[stay], token[stay]
            steps.cache.batch_select_indices(stay)
        size, remaining = len(live), max_new_tokens - counts[live]  # [n]
        k = min(draft_tokens, int(remaining.max()) - 1)
        index = int(counts[live].min()) - 1  # generated index of the fed token of the row furthest behind
        column, drafts, drafted = token, [], []
        proposing = torch.ones(size, dtype=torch.bool, device=device)  # rows still proposing
        proposed = torch.zeros_like(remaining)  # drafts each row proposed
        for j in range(k):
            logits = steps.draft(column[:, None], torch.cat([mask, ones[:size, : j + 1]], dim=1), index + j)
            probs = probabilities(logits) if do_sample or draft_confidence else None
            column = torch.multinomial(probs, 1, generator=generator).squeeze(1) if do_sample else logits.argmax(-1)
            drafted.append(probs)
            drafts.append(column)
            proposed += proposing
            if draft_confidence:  # a draft below the threshold is still proposed, the row's later ones are not
                proposing &= probs.gather(1, column[:, None]).squeeze(1) >= draft_confidence
                if not bool(proposing.any()):
                    break
        k = len(drafts)
        draft = torch.stack(drafts, 1) if drafts else token.new_zeros(size, 0)  # [n, k]
        verified = steps.verify(torch.cat([token[:, None], draft], 1), torch.cat([mask, ones[:size, : k + 1]], 1),
                                past)
        partial = proposed if draft_confidence else None  # None: every row proposed all k
        if do_sample:
            drafted_probs = torch.stack(drafted, 1) if drafted else verified.new_zeros(size, 0, verified.shape[-1])
            chosen, accepted = sampled_acceptance(probabilities(verified), drafted_probs, draft, generator, partial)
        else:
            chosen, accepted = greedy_acceptance(verified, draft)
            accepted = accepted if partial is None else accepted.minimum(partial)
        width = torch.arange(k + 1, device=device)
        ends = torch.isin(chosen, eos) & (width <= accepted[:, None])  # [n, k + 1]
        kept = torch.where(ends.any(1), ends.int().argmax(1) + 1, accepted + 1).minimum(remaining)  # >= 1
        if batch_minimum:
            open_rows = (kept == accepted + 1) & (kept < remaining)  # rows that neither end nor fill up
            if bool(open_rows.any()):
                kept = kept.minimum(kept[open_rows].min())
        keep = width < kept[:, None]  # [n, k + 1]
        tokens[live[:, None].expand_as(keep)[keep], (counts[live][:, None] + width)[keep]] = chosen[keep]
        counts[live] += kept
        done = (torch.isin(chosen, eos) & keep).any(1) | (counts[live] >= max_new_tokens)
        stats.verifications += 1
        stats.draft_steps += k
        stats.judged += int(torch.minimum(accepted + 1, proposed).sum())
        stats.proposed += int(proposed.sum())
        stats.accepted += int(accepted.sum())
        stats.row_verifications += size
        stats.committed += int(kept.sum())
        # P columns at least stay: skiptrain's forward runs the columns before P as prompt columns
        mask = compact_cache(steps.cache, torch.cat([mask, keep.to(mask.dtype)], dim=1), prompt_length)
        past = mask.shape[1]
        token = chosen[torch.arange(size, device=device), kept - 1]
    width = int(counts.max())
    return tokens[:, :width], counts, stats


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Cut every layer of ``cache`` to its first ``length`` columns (layers differ in length after a draft)."""
    for layer in cache.layers:
        layer.crop(min(0, length - layer.get_seq_length()))
