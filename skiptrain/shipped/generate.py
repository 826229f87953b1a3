"""Skip decoding inside plain ``transformers`` ``generate()``: the ``custom_generate/generate.py`` of every export.

A merged export ships this package as ``custom_generate/``. transformers (>= 5.24) runs this module's
:func:`generate` in place of its own when the model is loaded with ``trust_remote_code=True``, or when
``model.generate(custom_generate=<export>, trust_remote_code=True)`` is called. It must not import skiptrain: the
schedule comes from the ``skip_schedule`` key of ``config.json`` (the ``skip_schedule.json`` mirror, read by
``schedule.py``), and everything else is transformers' own code.

:func:`generate` wraps transformers' ``GenerationMixin.generate`` unchanged (greedy, sampling, beam search,
logits processors, stopping criteria, streamers, pipelines), with every decoder layer gated for the duration of
the call (``gates.py``): each column runs its executed layer set, and the cache decoded into, a ``SkipCache``
(``cache.py``), sizes the attention masks by the layers that still run (Gemma's sliding and global layers). A call
whose columns need different sets (chunked verification in assisted decoding, or ``use_cache=False`` past the first
token when the prompt runs deeper than ``E(0)``) cannot be applied layer by layer and is refused, as are unsupported
model families and malformed schedules.

With ``speculative_tokens=K`` (K >= 1) the output is instead exactly full-depth decoding, and the schedule only buys
speed (lossless self-speculative decoding, ``lossless.py``).

``generate(sources=[...], tokenizer=tokenizer)`` takes bare sources instead of ``input_ids``: the export's recorded
prompt format (``skip_schedule.prompt_format``, applied by the shipped ``prompt_format.py``) makes from each the
prompt ids that training made, left-padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

from .cache import decode_into_skip_cache
from .gates import skipping
from .lossless import lossless_sequences
from .prompt_format import PromptFormat, PromptSource
from .schedule import CONFIG_KEY, SkipScheduleError


def _prompt(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    for value in (*args[:1], kwargs.get("inputs"), kwargs.get("input_ids"), kwargs.get("inputs_embeds")):
        if value is not None:
            return value
    raise SkipScheduleError("generate() under the skip schedule needs the prompt: pass input_ids (or inputs_embeds)")


def encode_sources(model: nn.Module, sources: Sequence[PromptSource], tokenizer: Any) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` of bare sources under the export's recorded prompt format.

    Raises:
        SkipScheduleError: when the export records no prompt format or no tokenizer is given.
    """
    recorded = (getattr(model.config, CONFIG_KEY, None) or {}).get("prompt_format")
    if recorded is None:
        raise SkipScheduleError(f"sources= needs config.json {CONFIG_KEY}.prompt_format: this export records no "
                                "prompt format; pass the prompts' input_ids instead")
    if tokenizer is None:
        raise SkipScheduleError("sources= needs tokenizer=: the export's tokenizer makes the prompts")
    rows = PromptFormat.from_dict(recorded).encode(tokenizer, sources)[1]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows], device=model.device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], device=model.device)
    return {"input_ids": ids, "attention_mask": mask}


class GeneratedNGramBlocker(LogitsProcessor):
    """transformers' ``NoRepeatNGramLogitsProcessor`` over the generated tokens only (skiptrain's
    ``sampling.block_repeated_ngrams``): a decoder-only model's input ids start with the prompt, so
    ``no_repeat_ngram_size`` would also forbid a summary to copy from its article."""

    def __init__(self, ngram_size: int, prompt_length: int) -> None:
        self.blocker, self.prompt_length = NoRepeatNGramLogitsProcessor(ngram_size), prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return self.blocker(input_ids[:, self.prompt_length:], scores)


def generate(*args: Any, model: nn.Module, sources: Sequence[PromptSource] | None = None, speculative_tokens: int = 0,
             block_repeated_ngrams: int = 0, draft_confidence: float = 0.0, draft_vocab: Any = None,
             **kwargs: Any) -> Any:
    """transformers' ``generate`` with every decoder layer run only for the columns whose executed set holds it.

    Takes (besides ``model``, which transformers passes by keyword, and ``sources``, see :func:`encode_sources`)
    and returns exactly what ``GenerationMixin.generate`` does. Prompts must be left-padded (every row's prompt
    ends at the last input column) and decoding must start from an empty cache.

    With ``speculative_tokens=K >= 1`` the output is full-depth decoding's, drafted K tokens at a time under the
    schedule (``lossless_sequences``, with its ``draft_confidence`` and ``draft_vocab`` levers; by default the
    export's recorded ``draft_vocab.json`` when it has one). With ``block_repeated_ngrams=N >= 1`` no row generates
    N tokens in a row that it has already generated (:class:`GeneratedNGramBlocker`; not with ``speculative_tokens``).

    Raises:
        SkipScheduleError: for a malformed schedule, an unsupported family, right padding, a non-empty cache passed
            in (for a model with sliding-window and global layers, any cache but a ``SkipCache``), or a forward call
            whose columns need different layer sets.
    """
    if sources is not None:
        if args or any(kwargs.get(name) is not None for name in ("inputs", "input_ids", "inputs_embeds")):
            raise SkipScheduleError("generate() got sources= and prompt ids: allowed one of them")
        kwargs.update(encode_sources(model, sources, kwargs.get("tokenizer")))
    prompt = _prompt(args, kwargs)
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool(mask[:, -1].all()):
        raise SkipScheduleError("attention_mask has padding in its last column: allowed only left-padded prompts "
                                "(tokenizer.padding_side = 'left'), so that every prompt ends at the same column")
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is not None and cache.get_seq_length() > 0:
        raise SkipScheduleError("a non-empty cache was passed: allowed only decoding from an empty cache, where "
                                "generated indices count from the end of the prompt")
    if not isinstance(speculative_tokens, int) or speculative_tokens < 0:
        raise SkipScheduleError(f"speculative_tokens={speculative_tokens!r} is invalid: allowed an integer >= 0 "
                                "(0 decodes under the schedule, K >= 1 decodes losslessly with K draft tokens)")
    if not isinstance(block_repeated_ngrams, int) or block_repeated_ngrams < 0:
        raise SkipScheduleError(f"block_repeated_ngrams={block_repeated_ngrams!r} is invalid: allowed an integer >= 0 "
                                "(0 blocks nothing)")
    if block_repeated_ngrams and speculative_tokens:
        raise SkipScheduleError(f"block_repeated_ngrams={block_repeated_ngrams} is invalid with speculative_tokens="
                                f"{speculative_tokens}: allowed 0")
    if not speculative_tokens and (draft_confidence or draft_vocab is not None):
        raise SkipScheduleError("draft_confidence and draft_vocab are invalid without speculative_tokens: allowed "
                                "with speculative_tokens=K >= 1")
    if speculative_tokens:
        return lossless_sequences(model, prompt, speculative_tokens, draft_confidence, draft_vocab, **kwargs)
    if block_repeated_ngrams:  # the input ids transformers gives processors start with the prompt (none for embeds)
        prompt_ids = 0 if prompt.is_floating_point() else prompt.shape[1]
        kwargs["logits_processor"] = LogitsProcessorList(
            [*(kwargs.get("logits_processor") or []), GeneratedNGramBlocker(block_repeated_ngrams, prompt_ids)])
    decode_into_skip_cache(model, kwargs)
    with skipping(model, prompt.shape[1]):
        return GenerationMixin.generate(model, *args, **kwargs)
