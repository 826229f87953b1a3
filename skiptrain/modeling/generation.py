"""Batched, KV-cached skip-aware generation: the reference inference front-end.

Prompts are left-padded so they all end at column ``P``; the prompt runs at prompt depth in one prefill
call, then each step feeds one column per row through the layers of ``executed_layers(g)`` only, reusing
the keys/values that earlier (deeper) tokens left in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, StoppingCriteriaList
from transformers.generation.logits_process import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer

from skiptrain.core.schedules import SkipSchedule
from skiptrain.errors import UsageError
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.forward import skip_hidden_states


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen.

    Args:
        do_sample: Sample from the (warped) distribution; ``False`` is greedy decoding.
        temperature: Softmax temperature (> 0), used when sampling.
        top_k: Keep only the ``top_k`` most likely tokens when sampling (0 keeps all).
        top_p: Keep the smallest set of tokens whose probability reaches ``top_p`` when sampling (1 keeps all).
        block_repeated_ngrams: Never generate a sequence of this many tokens that the row has already generated, in
            greedy decoding and sampling alike (0 blocks nothing). Only generated tokens count, not the prompt, so a
            summary can still copy from its article; transformers' ``no_repeat_ngram_size`` counts the prompt too.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    block_repeated_ngrams: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise UsageError(f"temperature={self.temperature} is invalid: allowed > 0")
        if self.top_k < 0:
            raise UsageError(f"top_k={self.top_k} is invalid: allowed >= 0 (0 disables it)")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p={self.top_p} is invalid: allowed 0 < top_p <= 1")
        if self.block_repeated_ngrams < 0:
            raise UsageError(f"block_repeated_ngrams={self.block_repeated_ngrams} is invalid: allowed >= 0 (0 blocks "
                             "nothing)")

    def warpers(self) -> LogitsProcessorList:
        """transformers' own logits warpers for this configuration."""
        warpers = LogitsProcessorList()
        if self.do_sample and self.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(self.temperature))
        if self.do_sample and self.top_k > 0:
            warpers.append(TopKLogitsWarper(self.top_k))
        if self.do_sample and self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(self.top_p))
        return warpers

    def repeat_blocker(self) -> NoRepeatNGramLogitsProcessor | None:
        """transformers' n-gram blocker for ``block_repeated_ngrams``, to be given the generated tokens only."""
        return NoRepeatNGramLogitsProcessor(self.block_repeated_ngrams) if self.block_repeated_ngrams else None


@dataclass(frozen=True)
class GenerationOutput:
    """Result of :func:`generate_under_schedule`.

    Args:
        tokens: ``[B, G]`` generated token ids; after a row's end-of-sequence token, ``pad_token_id``.
        lengths: ``[B]`` generated tokens per row, end-of-sequence token included.
        logits: ``[B, G, vocab]`` the logits each token was chosen from (only with ``return_logits=True``).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    logits: torch.Tensor | None = None

    def texts(self, tokenizer) -> list[str]:
        """Each row's generated text (through its end-of-sequence token), special tokens removed."""
        return [tokenizer.decode(row[:n], skip_special_tokens=True).strip()
                for row, n in zip(self.tokens.tolist(), self.lengths.tolist(), strict=True)]


@torch.no_grad()
def generate_under_schedule(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    schedule: SkipSchedule,
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int = 0,
    generator: torch.Generator | None = None,
    return_logits: bool = False,
    synced: bool = False,
    streamer: BaseStreamer | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` per row under ``schedule`` with a KV cache.

    Args:
        model: A supported Hugging Face causal LM (optionally peft-wrapped).
        input_ids: ``[B, P]`` prompts, left-padded so every prompt ends at column ``P``.
        attention_mask: ``[B, P]`` 1 for prompt tokens, 0 for padding.
        schedule: The skip schedule (built for the model's decoder layer count).
        max_new_tokens: Maximum tokens generated per row.
        sampling: Greedy by default.
        eos_token_id: Token id(s) that end a row; ``None`` generates ``max_new_tokens`` for every row.
        pad_token_id: Filler for rows that have ended.
        generator: Random generator for sampling.
        return_logits: Also return the logits of every step (for tests and scoring).
        synced: Run all ``max_new_tokens`` steps even after every row has ended (ended rows get
            ``pad_token_id``), so every rank calls the same layers the same number of times: ZeRO-3 and FSDP gather
            weights inside each layer call, and a rank that stopped early would leave the others waiting.
        streamer: transformers' streamer (e.g. ``TextStreamer``), given each step's generated tokens (one row).
        stopping_criteria: transformers' stopping criteria (e.g. ``StopStringCriteria``): a row they stop has ended
            after its current token, which it keeps.
    """
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens={max_new_tokens} is invalid: allowed >= 1")
    sampling = sampling or SamplingConfig()
    warpers, blocker = sampling.warpers(), sampling.repeat_blocker()
    parts = decoder_parts(model)
    eos = torch.tensor([] if eos_token_id is None else eos_token_id, device=input_ids.device).flatten()
    batch, prompt_length = input_ids.shape
    cache = DynamicCache(config=parts.model.config)
    finished = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
    lengths = torch.zeros(batch, dtype=torch.long, device=input_ids.device)
    tokens, step_logits = [], []
    new_ids, mask = input_ids, attention_mask
    for _ in range(max_new_tokens):
        hidden = skip_hidden_states(model, new_ids, mask, schedule, prompt_length, cache, parts)  # [B, q, H]
        logits = parts.logits(hidden[:, -1]).float()  # [B, vocab]
        if return_logits:
            step_logits.append(logits)
        if blocker and tokens:  # the generated tokens alone: the prompt's n-grams stay allowed
            logits = blocker(torch.cat(tokens, dim=1), logits)
        if warpers:  # transformers' warpers take the sequence so far; greedy decoding needs none of it
            logits = warpers(torch.cat([input_ids, *tokens], dim=1) if tokens else input_ids, logits)
        if sampling.do_sample:
            next_ids = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)  # [B]
        else:
            next_ids = logits.argmax(-1)  # [B]
        next_ids = torch.where(finished, torch.full_like(next_ids, pad_token_id), next_ids)
        lengths += (~finished).long()
        finished |= torch.isin(next_ids, eos)
        tokens.append(next_ids[:, None])
        if streamer is not None:
            streamer.put(next_ids.cpu())
        if stopping_criteria:
            finished |= stopping_criteria(torch.cat([input_ids, *tokens], dim=1), logits).to(finished.device)
        if not synced and bool(finished.all()):
            break
        new_ids = next_ids[:, None]  # [B, 1]
        mask = torch.cat([mask, torch.ones_like(new_ids, dtype=mask.dtype)], dim=1)
    if streamer is not None:
        streamer.end()
    return GenerationOutput(
        tokens=torch.cat(tokens, dim=1),
        lengths=lengths,
        logits=torch.stack(step_logits, dim=1) if return_logits else None,
    )
