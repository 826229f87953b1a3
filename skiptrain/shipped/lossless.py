"""``generate(speculative_tokens=K)``: lossless self-speculative decoding through the gated transformers model.

:func:`lossless_sequences` runs the ``speculate`` loop (``speculate.py``) with :class:`GatedSteps`: drafts go
through the decoder layers the schedule runs for their generated index, prefill and verification through all of
them, on one ``SkipCache`` in which every layer keeps every column (``full_length_cache``): the attention masks apply
a sliding window (Gemma 2 and 3, Mistral and Qwen with a window) by column, and the loop compacts the cache after
each verification so that the window covers a row's last tokens. It takes transformers' greedy and sampling options
(temperature, top-k, top-p, as :func:`sampling_warpers` builds them) and returns what transformers' ``generate``
returns by default.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .cache import cache_argument, full_length_cache
from .draft_head import DraftHead, draft_confidence_problem, draft_vocab_problem, recorded_draft_vocab
from .gates import ColumnGate, checked_layers, gates_installed, own_forwards
from .schedule import SkipScheduleError, read_schedule
from .speculate import crop_cache, speculate


class GatedSteps:
    """:class:`SpeculativeSteps` through the model's own forward, decoder layers gated by a :class:`ColumnGate`.

    A draft for generated index ``g`` runs ``executed_layers[g]``; prefill and verification run every layer. With a
    draft vocabulary, a draft runs the model's body and scores those token ids alone (:class:`DraftHead`).

    Args:
        model: The exported causal LM (its layers gated while decoding).
        gate: The gate of its layers; its ``active`` set is chosen here per call.
        draft_vocab: ``[N]`` token ids the drafts choose from (default: the whole vocabulary).
    """

    def __init__(self, model: nn.Module, gate: ColumnGate, draft_vocab: torch.Tensor | None = None) -> None:
        self.model, self.gate = model, gate
        self.cache = full_length_cache(model.config)
        self.every_layer = frozenset(range(model.config.num_hidden_layers))
        self.draft_head = None if draft_vocab is None else \
            DraftHead(model.get_output_embeddings(), draft_vocab, model.config)

    def _inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: frozenset[int]) -> dict:
        self.gate.active = layers
        past = self.cache.get_seq_length()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # as transformers' generate
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions,
                **cache_argument(self.cache), "use_cache": True}

    def _logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: frozenset[int],
                last_only: bool) -> torch.Tensor:
        inputs = self._inputs(input_ids, attention_mask, layers)
        logits = self.model(**inputs, logits_to_keep=int(last_only)).logits
        return (logits[:, -1] if last_only else logits).float()

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._logits(input_ids, attention_mask, self.every_layer, last_only=True)

    def draft(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, index: int) -> torch.Tensor:
        layers = frozenset(self.gate.table[min(index, len(self.gate.table) - 1)])
        if self.draft_head is None:
            return self._logits(input_ids, attention_mask, layers, last_only=True)
        hidden = self.model.base_model(**self._inputs(input_ids, attention_mask, layers)).last_hidden_state
        return self.draft_head(hidden[:, -1])

    def verify(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past: int) -> torch.Tensor:
        crop_cache(self.cache, past)
        return self._logits(input_ids, attention_mask, self.every_layer, last_only=False)


SPECULATIVE_OPTIONS = {"input_ids", "inputs", "attention_mask", "max_new_tokens", "do_sample", "temperature", "top_k",
                       "top_p", "eos_token_id", "pad_token_id", "use_cache", "trust_remote_code", "custom_generate",
                       "tokenizer"}
"""What ``generate(speculative_tokens=K)`` accepts; other options (beam search, processors, streamers) are refused."""


def sampling_warpers(do_sample: bool | None, temperature: float | None, top_k: int | None,
                     top_p: float | None) -> LogitsProcessorList:
    """transformers' logits warpers for sampling options (``None``: the option is unset); none for greedy decoding.

    The same warpers skiptrain's ``SamplingConfig.warpers`` builds for the same options (a test keeps them equal).
    """
    warpers = LogitsProcessorList()
    if do_sample:
        if temperature not in (None, 1.0):
            warpers.append(TemperatureLogitsWarper(temperature))
        if top_k:
            warpers.append(TopKLogitsWarper(top_k))
        if top_p not in (None, 1.0):
            warpers.append(TopPLogitsWarper(top_p))
    return warpers


def lossless_sequences(model: nn.Module, prompt: torch.Tensor, draft_tokens: int, draft_confidence: float = 0.0,
                       draft_vocab: Any = None, **kwargs: Any) -> torch.Tensor:
    """The sequences of full-depth greedy decoding or sampling, drafted ``draft_tokens`` tokens per verification
    under the ``config.json`` schedule.

    ``draft_confidence`` (``speculate``): a row stops proposing drafts in a round after one less probable than
    this. ``draft_vocab``: the token ids the drafts choose from (a list or 1-D tensor); ``None`` takes the export's
    recorded ``draft_vocab.json`` when it has one, ``False`` the whole vocabulary.

    Returns ``[B, P + G]`` sequences (prompt, then the generated tokens, ``pad_token_id`` after a row's end), as
    transformers' ``generate`` does with its default ``return_dict_in_generate=False``. Sampling draws from torch's
    global generator.

    Raises:
        SkipScheduleError: for an option the lossless mode does not take, a missing ``max_new_tokens``,
            ``speculative_tokens`` above it, ``draft_confidence`` outside ``[0, 1)``, or a ``draft_vocab`` (or
            recorded ``draft_vocab.json``) that is not distinct token ids of the vocabulary.
    """
    config = model.generation_config
    unsupported = sorted(set(kwargs) - SPECULATIVE_OPTIONS)
    if unsupported:
        raise SkipScheduleError(f"generate(speculative_tokens=...) does not take {unsupported}: allowed "
                                f"{sorted(SPECULATIVE_OPTIONS - {'inputs', 'trust_remote_code', 'custom_generate'})}")
    max_new_tokens = kwargs.get("max_new_tokens") or config.max_new_tokens
    if not max_new_tokens:
        raise SkipScheduleError("generate(speculative_tokens=...) needs max_new_tokens: allowed an integer >= 1")
    if draft_tokens > max_new_tokens:
        raise SkipScheduleError(f"speculative_tokens={draft_tokens} is invalid with max_new_tokens={max_new_tokens}: "
                                f"allowed 0 <= speculative_tokens <= {max_new_tokens}")
    problem = draft_confidence_problem(draft_confidence)
    if problem is not None:
        raise SkipScheduleError(f"draft_confidence={draft_confidence!r} is invalid: {problem}")
    vocab = draft_vocab_ids(model, draft_vocab)
    setting = {name: kwargs.get(name, getattr(config, name, None))
               for name in ("do_sample", "temperature", "top_k", "top_p", "eos_token_id", "pad_token_id")}
    warpers = sampling_warpers(setting["do_sample"], setting["temperature"], setting["top_k"], setting["top_p"])
    pad = setting["pad_token_id"]
    eos = setting["eos_token_id"]
    mask = kwargs.get("attention_mask")
    mask = torch.ones_like(prompt) if mask is None else mask
    _, table = read_schedule(model.config)
    layers = checked_layers(model)
    gate = ColumnGate(prompt.shape[1], range(len(layers)), table)
    with gates_installed(layers, own_forwards(layers), gate):
        tokens, _, _ = speculate(
            GatedSteps(model, gate, vocab), prompt, mask, max_new_tokens, draft_tokens, eos,
            pad if pad is not None else 0, do_sample=bool(setting["do_sample"]), warpers=warpers,
            draft_confidence=draft_confidence,
        )
    return torch.cat([prompt, tokens], dim=1)


def draft_vocab_ids(model: nn.Module, draft_vocab: Any) -> torch.Tensor | None:
    """The draft vocabulary ``generate(speculative_tokens=K, draft_vocab=...)`` asks for: ``None``, the export's
    recorded one (if any); ``False``, none; else the given ids, checked."""
    if draft_vocab is None:
        return recorded_draft_vocab(model)
    if draft_vocab is False:
        return None
    ids = draft_vocab.tolist() if isinstance(draft_vocab, torch.Tensor) and draft_vocab.dim() == 1 else draft_vocab
    ids = list(ids) if isinstance(ids, tuple) else ids
    problem = draft_vocab_problem(ids, model.config.vocab_size)
    if problem is not None:
        raise SkipScheduleError(f"draft_vocab is invalid: {problem}, or None (the export's recorded one) or False "
                                "(the whole vocabulary)")
    return torch.tensor(ids, dtype=torch.long)
