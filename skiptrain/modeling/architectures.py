"""The architecture table: the one place that knows Hugging Face model architectures (``config.model_type``).

The skip-aware forward drives a model's own decoder layers from a small loop (:mod:`skiptrain.modeling.forward`).
Around the layers it needs three architecture-specific pieces, kept here as one table so that adding an
architecture is one entry: how token embeddings (and learned positions) are made, which per-column inputs each
kind of layer receives besides the hidden states (rotary position embeddings, position ids), and the final norm. The
entry also names the default LoRA targets. Everything else (attention, caches, masks, the LM head) is the model's own
code.
``custom_generate``'s own table of decoder layers (it cannot import skiptrain) is tested to agree with this one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.pytorch_utils import Conv1D

from skiptrain.errors import ModelError, UsageError
from skiptrain.shipped.cache import cache_argument

SUPPORTED_ATTENTION = ("eager", "sdpa")
MIXTURE_OF_EXPERTS = ("mixtral", "qwen2_moe", "qwen3_moe", "phimoe", "olmoe", "deepseek_v2", "deepseek_v3",
                      "dbrx", "granitemoe", "jamba", "gpt_oss", "llama4")
"""Mixture-of-experts architectures, refused by name: not supported yet."""


@dataclass(frozen=True)
class Architecture:
    """How to drive one architecture of Hugging Face decoder-only models layer by layer.

    Args:
        decoder_path: Dotted attribute path from the ``*ForCausalLM`` model to the decoder body.
        layers_attr: Attribute of the decoder body holding the ``nn.ModuleList`` of decoder layers.
        embed: ``(decoder, input_ids, position_ids) -> hidden`` for the given columns.
        column_inputs: ``(decoder, hidden, position_ids, layer_type) -> kwargs`` every layer of that kind
            (``config.layer_types``: ``full_attention`` or ``sliding_attention``) receives besides the hidden states;
            each tensor (or tuple of tensors) is indexed by column along dim 1.
        final: ``(decoder, hidden) -> hidden`` after the last layer, before the LM head.
        lora_targets: The default LoRA target modules: the attention projections.
        attention: The attention implementations the architecture supports (the first is used when the requested
            one is not among them).
    """

    decoder_path: str
    layers_attr: str
    embed: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    column_inputs: Callable[[nn.Module, torch.Tensor, torch.Tensor, str], dict[str, Any]]
    final: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    lora_targets: tuple[str, ...]
    attention: tuple[str, ...] = SUPPORTED_ATTENTION

    @property
    def layers_path(self) -> str:
        """Dotted attribute path from the ``*ForCausalLM`` model to its ``nn.ModuleList`` of decoder layers."""
        return f"{self.decoder_path}.{self.layers_attr}"


def _llama_column_inputs(decoder: nn.Module, hidden: torch.Tensor, position_ids: torch.Tensor,
                         layer_type: str) -> dict[str, Any]:
    return {"position_ids": position_ids, "position_embeddings": decoder.rotary_emb(hidden, position_ids)}


def _gemma3_column_inputs(decoder: nn.Module, hidden: torch.Tensor, position_ids: torch.Tensor,
                          layer_type: str) -> dict[str, Any]:
    """Gemma 3 rotates sliding (local) and global layers' positions with different base frequencies."""
    return {"position_ids": position_ids, "position_embeddings": decoder.rotary_emb(hidden, position_ids, layer_type)}


def _positions_only(decoder: nn.Module, hidden: torch.Tensor, position_ids: torch.Tensor,
                    layer_type: str) -> dict[str, Any]:
    return {"position_ids": position_ids}


def _opt_embed(decoder: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    embeds = decoder.embed_tokens(input_ids)
    if decoder.project_in is not None:
        embeds = decoder.project_in(embeds)
    return embeds + decoder.embed_positions(None, position_ids=position_ids)


def _opt_final(decoder: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    if decoder.final_layer_norm is not None:
        hidden = decoder.final_layer_norm(hidden)
    return hidden if decoder.project_out is None else decoder.project_out(hidden)


_LLAMA_LAYOUT = Architecture(
    decoder_path="model",
    layers_attr="layers",
    embed=lambda decoder, input_ids, position_ids: decoder.embed_tokens(input_ids),
    column_inputs=_llama_column_inputs,
    final=lambda decoder, hidden: decoder.norm(hidden),
    lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
)

ARCHITECTURES: dict[str, Architecture] = {
    "llama": _LLAMA_LAYOUT,  # Llama 2/3, SmolLM/SmolLM2, TinyLlama
    "mistral": _LLAMA_LAYOUT,
    "qwen2": _LLAMA_LAYOUT,
    "qwen3": _LLAMA_LAYOUT,  # its q/k norms are inside the attention, the model's own code
    # Gemma 2: the embedding scales itself, layer_types alternate sliding and global layers (masks per layer, see
    # DecoderParts.layer_masks), attention logits are soft-capped inside the attention, which sdpa cannot do, and
    # final logits are soft-capped after the LM head (DecoderParts.logits).
    "gemma2": dataclasses.replace(_LLAMA_LAYOUT, attention=("eager",)),
    # Gemma 3 (text): sliding and global layers in a pattern (five to one), each kind with its own rotary base
    # frequency; its q/k norms are inside the attention. It has no attention-logit soft-capping, so sdpa runs it.
    "gemma3_text": dataclasses.replace(_LLAMA_LAYOUT, column_inputs=_gemma3_column_inputs),
    "phi3": dataclasses.replace(_LLAMA_LAYOUT, lora_targets=("qkv_proj", "o_proj")),  # fused q/k/v projection
    "opt": Architecture(
        decoder_path="model.decoder",
        layers_attr="layers",
        embed=_opt_embed,
        column_inputs=_positions_only,
        final=_opt_final,
        lora_targets=("q_proj", "k_proj", "v_proj", "out_proj"),
    ),
    "gpt2": Architecture(
        decoder_path="transformer",
        layers_attr="h",
        embed=lambda decoder, input_ids, position_ids: decoder.drop(
            decoder.wte(input_ids) + decoder.wpe(position_ids)
        ),
        column_inputs=_positions_only,
        final=lambda decoder, hidden: decoder.ln_f(hidden),
        lora_targets=("c_attn",),
    ),
}


def architecture(model_type: str) -> Architecture:
    """The table's entry for ``config.model_type``.

    Raises:
        ModelError: for an architecture the table lacks, naming the supported ones.
    """
    if model_type in MIXTURE_OF_EXPERTS:
        raise ModelError(f"model_type={model_type!r} is a mixture-of-experts model, which the skip-aware forward does "
                         f"not support yet: allowed {sorted(ARCHITECTURES)}")
    found = ARCHITECTURES.get(model_type)
    if found is None:
        raise ModelError(
            f"model_type={model_type!r} is not supported by the skip-aware forward: "
            f"allowed {sorted(ARCHITECTURES)} (add an entry to skiptrain.modeling.architectures.ARCHITECTURES)"
        )
    return found


def check_lora_targets(config: PretrainedConfig, targets: Sequence[str]) -> None:
    """Refuse LoRA ``targets`` that name no linear layer of a model of ``config`` (built on the meta device: no
    weights, no memory), listing the names that can be targeted.

    A target matches as peft matches it: a module's full name, or its last dotted components.

    Raises:
        UsageError: naming the targets that match nothing.
    """
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linear = [name for name, module in model.named_modules() if isinstance(module, nn.Linear | Conv1D)]
    unmatched = [t for t in targets if not any(name == t or name.endswith("." + t) for name in linear)]
    if unmatched:
        allowed = sorted({name.rsplit(".", 1)[-1] for name in linear})
        raise UsageError(f"lora.target_modules={list(targets)} is invalid: {unmatched} match no linear layer of "
                         f"model_type={config.model_type!r}: allowed {allowed}")


@dataclass(frozen=True)
class DecoderParts:
    """The pieces of one model that the skip-aware loop drives."""

    model: PreTrainedModel
    architecture: Architecture
    decoder: nn.Module
    layers: nn.ModuleList
    lm_head: nn.Module

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on final hidden states, with the config's final logit soft-capping (Gemma 2) if it has one."""
        logits = self.lm_head(hidden)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @property
    def layer_types(self) -> list[str]:
        """Each layer's kind: ``config.layer_types``, or one kind for all (sliding where a window is set)."""
        config = self.model.config
        kinds = getattr(config, "layer_types", None)
        if kinds is not None:
            return list(kinds)
        sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
        return ["sliding_attention" if sliding else "full_attention"] * self.num_layers

    def layer_inputs(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> list[dict[str, Any]]:
        """The per-column inputs each layer gets for these columns, made once per kind of layer."""
        kinds = self.layer_types
        made = {kind: self.architecture.column_inputs(self.decoder, hidden, position_ids, kind) for kind in set(kinds)}
        return [made[kind] for kind in kinds]

    def layer_masks(
        self,
        hidden: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        position_ids: torch.Tensor,
    ) -> list[torch.Tensor | None]:
        """The attention mask each layer gets for these columns, built by transformers' own mask functions."""
        config = self.model.config
        kinds = self.layer_types
        builders = {"full_attention": create_causal_mask, "sliding_attention": create_sliding_window_causal_mask}
        made = {
            kind: builders[kind](
                config=config,
                inputs_embeds=hidden,
                attention_mask=attention_mask,
                **cache_argument(cache),
                position_ids=position_ids,
                layer_idx=_deepest_cache(cache, [i for i, k in enumerate(kinds) if k == kind]),
            )
            for kind in set(kinds)
        }
        return [made[kind] for kind in kinds]


def _deepest_cache(cache: Any, layers: list[int]) -> int | None:
    """Of ``layers``, one whose cache holds every earlier column: the mask's key length is read from it.

    transformers reads it from the first layer of a kind, but under a schedule that layer may have been skipped
    (its cache ends early, e.g. Gemma 2's first global layer); every layer that still runs has the longest cache.
    """
    if cache is None:
        return None
    return max(layers, key=lambda i: cache.layers[i].get_seq_length())


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """transformers' own (non-reentrant) activation checkpointing of ``model``'s decoder layers; transformers before
    5.24 calls it gradient checkpointing."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def activation_checkpointing_on(model: PreTrainedModel) -> bool:
    """Whether :func:`enable_activation_checkpointing` was applied to ``model``."""
    return getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing


def attention_for(model_type: str, requested: str) -> str:
    """``requested`` if the architecture supports it, else the one it prefers (Gemma 2: eager), so that the default
    ``sdpa`` loads every architecture; an architecture the table lacks keeps ``requested``."""
    found = ARCHITECTURES.get(model_type)
    return requested if found is None or requested in found.attention else found.attention[0]


def decoder_parts(model: nn.Module) -> DecoderParts:
    """Locate the decoder layers of a (possibly peft-wrapped) Hugging Face causal LM.

    Raises:
        ModelError: for an unsupported architecture.
        UsageError: for an unsupported attention implementation.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    found = architecture(config.model_type)
    attention = config._attn_implementation
    if attention not in found.attention:
        raise UsageError(
            f"attn_implementation={attention!r} is not supported by the skip-aware forward for "
            f"model_type={config.model_type!r}: allowed {list(found.attention)}"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelError("use_bidirectional_attention=True is not supported: the skip-aware forward and decoding are "
                         "causal; set use_bidirectional_attention=false")
    if getattr(config, "layerdrop", 0.0) and base.training:
        raise ModelError(
            f"layerdrop={config.layerdrop} is not supported: random layer dropping conflicts with the schedule "
            "and with sharded training; set layerdrop=0"
        )
    decoder = base
    for name in found.decoder_path.split("."):
        decoder = getattr(decoder, name)
    return DecoderParts(base, found, decoder, getattr(decoder, found.layers_attr), base.get_output_embeddings())
