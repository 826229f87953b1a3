"""The KV cache generate decodes into under a schedule, whose attention masks follow the layers that run, and the
cache speculative decoding cuts back and compacts."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import create_causal_mask

from .schedule import SkipScheduleError

CACHE_ARGUMENT = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
"""What transformers calls the KV cache argument of models, decoder layers, ``generate`` and the mask builders:
``cache`` since 5.24, ``past_key_values`` before. Every call that passes a cache names it by this (or
:func:`cache_argument`), so one code runs on the whole supported range."""


def cache_argument(cache: Any) -> dict[str, Any]:
    """``cache`` as the keyword argument of the installed transformers (:data:`CACHE_ARGUMENT`)."""
    return {CACHE_ARGUMENT: cache}


class SkipCache(DynamicCache):
    """transformers' ``DynamicCache``, with each call's attention masks sized by the longest cache of a layer's kind.

    transformers sizes the masks of every sliding (or every global) layer by the first layer of that kind. Under a
    schedule that layer may have been skipped, and its cache then ends early (Gemma 2's first global layer is layer 1);
    every layer that still runs holds every earlier column, so the longest cache of the kind is theirs. With a single
    kind of layer the longest is layer 0's, which always runs: the masks are transformers' own.
    """

    def _longest_of_kind(self, layer_idx: int) -> int:
        if layer_idx >= len(self.layers):  # not made yet (a cache built without a config)
            return layer_idx
        kind = self.is_sliding[layer_idx]
        same = [i for i, sliding in enumerate(self.is_sliding) if sliding == kind]
        return max(same, key=lambda i: self.layers[i].get_seq_length())

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return super().get_mask_sizes(query_length, self._longest_of_kind(layer_idx))

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return super().get_query_offset(self._longest_of_kind(layer_idx))


def full_length_cache(config: Any) -> SkipCache:
    """A :class:`SkipCache` for ``config``'s layers in which every layer keeps every column, sliding-window ones too.

    transformers' sliding-window layers keep only the last ``window - 1`` columns, which a cut back to earlier columns
    or a compaction (:func:`compact_cache`) cannot undo. Here the attention masks apply the window: they count it in
    columns, as transformers does. All layers are then one kind, and the longest cache is one of those that ran.
    """
    cache = SkipCache(config=config)
    cache.layers = [DynamicLayer() for _ in cache.layers]
    return cache


def compact_cache(cache: DynamicCache, attention_mask: torch.Tensor, min_length: int = 0) -> torch.Tensor:
    """Move each row's padding columns (mask 0) before its tokens, in every layer's keys and values, and drop the
    leading columns that are padding in every row (keeping ``min_length`` columns at least); the mask, rearranged.

    Afterwards every row is left-padded, its tokens in the last columns in their order: a sliding window counted in
    columns covers exactly a row's last tokens, and positions, counted from the mask, stay those the keys were
    rotated by. Every layer must hold ``attention_mask.shape[1]`` columns (of a :func:`full_length_cache`).

    Args:
        cache: The cache, rearranged in place.
        attention_mask: ``[B, S]`` 1 for tokens, 0 for padding.
        min_length: Columns to keep at least.

    Returns:
        ``[B, S']`` the mask of the compacted cache, ``S' <= S``.
    """
    if bool((attention_mask[:, 1:] >= attention_mask[:, :-1]).all()):  # every row left-padded already
        return attention_mask
    order = attention_mask.sort(dim=1, stable=True).indices  # [B, S]: padding first, each part in its order
    drop = min(int((attention_mask == 0).sum(1).min()), attention_mask.shape[1] - min_length)
    order = order[:, max(drop, 0):]
    for layer in cache.layers:
        layer.keys, layer.values = _take_columns(layer.keys, order), _take_columns(layer.values, order)
    return attention_mask.gather(1, order)


def _take_columns(states: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``states[b, :, order[b]]`` for every row ``b``: ``[B, H, S, D]`` -> ``[B, H, S', D]``, contiguous.

    One ``index_select`` of whole ``D``-vectors: several times faster on CPU than ``take_along_dim``, which gathers
    element by element through an index broadcast to the output's shape.
    """
    batch, heads, length, dim = states.shape
    starts = torch.arange(batch * heads, device=states.device).view(batch, heads, 1) * length  # [B, H, 1]
    rows = (starts + order[:, None, :]).flatten()  # [B * H * S']: row of each kept column in [B * H * S, D]
    return states.reshape(-1, dim).index_select(0, rows).view(batch, heads, -1, dim)


def has_layer_kinds(config: Any) -> bool:
    """Whether a model mixes sliding-window and global attention layers (Gemma 2 and 3)."""
    return len(set(getattr(config, "layer_types", None) or ())) > 1


def decode_into_skip_cache(model: nn.Module, kwargs: dict[str, Any]) -> None:
    """Give ``generate`` ``kwargs`` a :class:`SkipCache` where transformers would make a ``DynamicCache``, and where
    a model with sliding-window and global layers would get a static cache only because its generation config
    defaults to one (Gemma checkpoints ask for ``"hybrid"``): the tokens are the same, and its masks are right.

    Raises:
        SkipScheduleError: for a model with layer kinds given another cache, or asked for another
            ``cache_implementation`` (as an argument or in the ``generation_config`` passed).
    """
    layer_kinds = has_layer_kinds(model.config)
    passed = kwargs.get("cache", kwargs.get("past_key_values"))
    if passed is not None:
        if layer_kinds and not isinstance(passed, SkipCache):
            raise SkipScheduleError(f"a {type(passed).__name__} was passed for a model with sliding-window and global "
                                    "layers: allowed none (generate makes a cache whose masks follow the layers that "
                                    "run)")
        return
    requested = kwargs.get("generation_config")
    if kwargs.get("use_cache", (requested or model.generation_config).use_cache) is False:
        return
    asked = kwargs.get("cache_implementation", getattr(requested, "cache_implementation", None))
    if asked not in (None, "dynamic"):
        if layer_kinds:
            raise SkipScheduleError(f"cache_implementation={asked!r} is invalid for a model with sliding-window and "
                                    "global layers: allowed None or 'dynamic'")
        return
    default = model.generation_config.cache_implementation
    if asked is None and default not in (None, "dynamic"):
        if not layer_kinds:
            return  # the static cache the model's generation config asks for
        kwargs["cache_implementation"] = None
    kwargs.pop("past_key_values", None)
    kwargs.pop("cache", None)
    kwargs.update(cache_argument(SkipCache(config=model.config.get_text_config(decoder=True))))
