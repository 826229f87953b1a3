"""The skip-aware forward: a Hugging Face decoder run under a :class:`~skiptrain.core.schedules.SkipSchedule`.

A batch is left-padded so every prompt ends at column ``P``. By the nesting invariant the columns that run
layer ``l`` form a prefix ``[0, n_l)``, so layer ``l`` is applied to ``hidden[:, :n_l]`` only and the other
columns pass through unchanged. The same loop serves training (all columns at once, no cache) and
KV-cached decoding (a chunk of new columns per call), which is why the two agree exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from skiptrain.core.schedules import SkipSchedule
from skiptrain.modeling.architectures import DecoderParts, decoder_parts
from skiptrain.shipped.cache import cache_argument


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of a left-padded batch, as ``transformers`` generation computes them (pads get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, S]


def _prefix(value: Any, length: int) -> Any:
    """The first ``length`` columns (dim 1) of a tensor or tuple of tensors; other values unchanged."""
    if isinstance(value, torch.Tensor):
        return value[:, :length]
    if isinstance(value, tuple):
        return tuple(_prefix(v, length) for v in value)
    return value


def _mask_prefix(mask: torch.Tensor | None, length: int, num_new: int) -> torch.Tensor | None:
    """Rows of the first ``length`` new columns; keys without the trailing ``num_new - length`` new columns."""
    if mask is None or length == num_new:
        return mask
    return mask[:, :, :length, : mask.shape[-1] - (num_new - length)]  # [B, 1, length, kv]


class _KeepInGraph(torch.autograd.Function):
    """Return ``hidden`` unchanged while making ``unused`` part of the graph with a zero gradient.

    A layer that no column runs is still called (on one column) so sharded strategies see every layer on
    every step and data-parallel gradient reduction finds a (zero) gradient for each of its parameters.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, unused: torch.Tensor) -> torch.Tensor:
        ctx.unused_shape, ctx.unused_dtype = unused.shape, unused.dtype
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad.new_zeros(ctx.unused_shape, dtype=ctx.unused_dtype)


def _check_prompt_alignment(attention_mask: torch.Tensor, prompt_length: int, num_columns: int) -> None:
    if not 0 <= prompt_length <= num_columns:
        raise ValueError(f"prompt_length={prompt_length} is invalid: allowed 0 <= prompt_length <= {num_columns}")
    if prompt_length and not bool(attention_mask[:, prompt_length - 1].all()):
        raise ValueError(
            f"prompt_length={prompt_length}: some rows have padding at column {prompt_length - 1}; prompts must be "
            "left-padded so that every row's prompt ends at column prompt_length"
        )


def skip_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    schedule: SkipSchedule,
    prompt_length: int,
    cache: Any = None,
    parts: DecoderParts | None = None,
) -> torch.Tensor:
    """Final hidden states (after the final norm) of new columns under ``schedule``.

    Args:
        model: A supported Hugging Face causal LM, optionally wrapped by peft.
        input_ids: ``[B, q]`` token ids of the new columns ``[past, past + q)``; ``past`` is the cache length
            (0 without a cache).
        attention_mask: ``[B, past + q]`` 1 for tokens, 0 for padding; prompts are left-padded to end at
            column ``prompt_length``.
        schedule: The skip schedule, built for the model's number of decoder layers.
        prompt_length: ``P``, the column where every prompt ends (0 for plain language-model data).
        cache: A ``transformers`` cache for incremental decoding, or ``None`` (training and scoring).
        parts: Pre-located :func:`~skiptrain.modeling.architectures.decoder_parts` (saves the lookup in a decode loop).

    Returns:
        ``[B, q, hidden]`` hidden states of the new columns, ready for the LM head.

    Without a cache every decoder layer is called on every step so that sharded strategies (ZeRO-3, FSDP)
    see the same module order on every rank; a layer that no column runs is called on one column and its
    output discarded with a zero gradient. With a cache, a layer that no new column runs is not called:
    nothing is computed or cached for it.
    """
    parts = parts or decoder_parts(model)
    schedule.check_num_layers(parts.num_layers)
    past = 0 if cache is None else cache.get_seq_length()
    num_new = input_ids.shape[1]
    if past == 0:
        _check_prompt_alignment(attention_mask, prompt_length, attention_mask.shape[1])
    position_ids = position_ids_from_mask(attention_mask)[:, past:]  # [B, q]
    hidden = parts.architecture.embed(parts.decoder, input_ids, position_ids)  # [B, q, H]
    masks = parts.layer_masks(hidden, attention_mask, cache, position_ids)
    column_inputs = parts.layer_inputs(hidden, position_ids)
    run_lengths = schedule.layer_run_lengths(prompt_length, past + num_new)
    for layer_index, layer in enumerate(parts.layers):
        length = min(max(run_lengths[layer_index] - past, 0), num_new)  # new columns that run this layer
        if length == 0 and cache is not None:
            continue
        called = max(length, 1)  # a layer no column runs is still called, on one column
        layer_out = layer(
            hidden[:, :called],  # [B, called, H]
            attention_mask=_mask_prefix(masks[layer_index], called, num_new),
            **cache_argument(cache),
            use_cache=cache is not None,
            **{name: _prefix(value, called) for name, value in column_inputs[layer_index].items()},
        )
        if length == 0:
            hidden = _KeepInGraph.apply(hidden, layer_out)
        elif length == num_new:
            hidden = layer_out
        else:
            hidden = torch.cat([layer_out, hidden[:, length:]], dim=1)  # [B, q, H]
    return parts.architecture.final(parts.decoder, hidden)


def skip_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    schedule: SkipSchedule,
    prompt_length: int,
    cache: Any = None,
) -> torch.Tensor:
    """Logits ``[B, q, vocab]`` of new columns under ``schedule``; arguments as :func:`skip_hidden_states`.

    Logits at column ``P - 1 + g`` predict generated token ``g``: the first generated token is predicted at
    prompt depth, the second from ``executed_layers(0)``, and so on.
    """
    parts = decoder_parts(model)
    hidden = skip_hidden_states(model, input_ids, attention_mask, schedule, prompt_length, cache, parts)
    return parts.logits(hidden)

