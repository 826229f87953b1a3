"""Skip decoding inside plain ``transformers`` ``generate()``: the ``custom_generate/generate.py`` of every export.

A merged export ships this file as ``custom_generate/generate.py``. transformers (>= 5.24) runs it in place of its
own ``generate`` when the model is loaded with ``trust_remote_code=True``, or when
``model.generate(custom_generate=<export>, trust_remote_code=True)`` is called. It must not import skiptrain: the
schedule comes from the ``skip_schedule`` key of ``config.json`` (the ``skip_schedule.json`` mirror), and
everything else is transformers' own code.

:func:`generate` wraps transformers' ``GenerationMixin.generate`` unchanged (greedy, sampling, beam search,
logits processors, stopping criteria, streamers, pipelines), with every decoder layer gated for the duration of
the call. Before each forward call of the model, a hook reads which columns the call brings (the cache length
and the number of new columns) and looks up their executed layer set: prompt columns (left of the prompt end
``P``, the input length) run ``prompt_layers``; the token at generated index ``g`` (column ``P + g``) runs
``executed_layers[g]``. A gated layer outside that set returns its input unchanged without running: no work, no
cache entry (by nesting, no later token runs it). A call whose columns need different sets (chunked verification
in assisted decoding, or ``use_cache=False`` past the first token when the prompt runs deeper than ``E(0)``)
cannot be applied layer by layer and is refused, as are unsupported model families and malformed schedules.

``generate(sources=[...], tokenizer=tokenizer)`` takes bare sources instead of ``input_ids``: the export's recorded
prompt format (``skip_schedule.prompt_format``, applied by the shipped ``prompt_format.py``) makes from each the
prompt ids that training made, left-padded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin

from .prompt_format import PromptFormat, Source

CONFIG_KEY = "skip_schedule"
FORMAT = "skiptrain.skip_schedule"
SCHEMA_VERSION = 1
POSITION = "generated_index"

# model_type -> dotted path from the *ForCausalLM model to its nn.ModuleList of decoder layers
DECODER_LAYERS = {
    "llama": "model.layers",
    "mistral": "model.layers",
    "qwen2": "model.layers",
    "qwen3": "model.layers",
    "phi3": "model.layers",
    "opt": "model.decoder.layers",
    "gpt2": "transformer.h",
}


# model_type -> why the custom generate cannot decode it exactly (skiptrain's own generate can)
UNSUPPORTED = {
    "gemma2": "transformers sizes each call's global-attention mask by the first global layer, whose cache the "
              "schedule can leave short",
}


class SkipScheduleError(ValueError):
    """The schedule, the model or the call cannot be decoded exactly under the skip schedule."""


def read_schedule(config: Any) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``(prompt_layers, executed_layers)`` from a model config's ``skip_schedule``, checked against the contract.

    Raises:
        SkipScheduleError: naming the key when the mirror is missing, of another format, version or position, built
            for another layer count, or its layer lists are not ascending, nested sets containing layer 0.
    """
    record = getattr(config, CONFIG_KEY, None)
    if not isinstance(record, dict):
        raise SkipScheduleError(f"config.json has no '{CONFIG_KEY}' object: allowed the mirror of skip_schedule.json "
                                "that skiptrain export writes")
    expected = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "position": POSITION,
                "num_layers": config.num_hidden_layers}
    for key, value in expected.items():
        if record.get(key) != value:
            raise SkipScheduleError(f"config.json {CONFIG_KEY}.{key}={record.get(key)!r} is invalid: allowed {value!r}")
    prompt = tuple(record.get("prompt_layers") or ())
    table = tuple(tuple(s) for s in record.get("executed_layers") or ())
    if not table:
        raise SkipScheduleError(f"config.json {CONFIG_KEY}.executed_layers is empty: allowed at least one entry")
    previous = set(range(config.num_hidden_layers))
    for name, layers in [("prompt_layers", prompt)] + [(f"executed_layers[{g}]", s) for g, s in enumerate(table)]:
        if list(layers) != sorted(set(layers)) or 0 not in layers or not set(layers) <= previous:
            raise SkipScheduleError(f"config.json {CONFIG_KEY}.{name}={list(layers)} is invalid: allowed ascending "
                                    "layer indices containing layer 0, a subset of the set before it (nesting)")
        previous = set(layers)
    return prompt, table


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a supported family.

    Raises:
        SkipScheduleError: naming the ``model_type`` and the supported ones.
    """
    if model.config.model_type in UNSUPPORTED:
        raise SkipScheduleError(f"model_type={model.config.model_type!r} is not supported by the skip schedule's "
                                f"custom generate: {UNSUPPORTED[model.config.model_type]}; decode with skiptrain "
                                "generate")
    path = DECODER_LAYERS.get(model.config.model_type)
    if path is None:
        raise SkipScheduleError(f"model_type={model.config.model_type!r} is not supported by the skip schedule's "
                                f"custom generate: allowed {sorted(DECODER_LAYERS)}")
    return functools.reduce(getattr, path.split("."), model)


class ColumnGate:
    """Which decoder layers the current forward call runs, from the columns it brings.

    Args:
        prompt_length: ``P``, the column where every (left-padded) prompt ends.
        prompt_layers: The layers prompt columns run.
        table: ``executed_layers``; generated index ``g`` uses entry ``min(g, len(table) - 1)``.
    """

    def __init__(self, prompt_length: int, prompt_layers: Sequence[int], table: Sequence[Sequence[int]]) -> None:
        self.prompt_length, self.prompt_layers, self.table = prompt_length, frozenset(prompt_layers), table
        self.active: frozenset[int] = frozenset()

    def layers_of(self, column: int) -> frozenset[int]:
        if column < self.prompt_length:
            return self.prompt_layers
        return frozenset(self.table[min(column - self.prompt_length, len(self.table) - 1)])

    def open_for(self, past: int, num_new: int) -> None:
        """Set the layers for new columns ``[past, past + num_new)``; by nesting, the first and last decide."""
        first, last = self.layers_of(past), self.layers_of(past + num_new - 1)
        if first != last:
            raise SkipScheduleError(
                f"a forward call over columns {past}-{past + num_new - 1} (prompts end at column "
                f"{self.prompt_length}) needs different executed layer sets, which one pass through the layers cannot "
                "apply exactly: decode with use_cache=True, one generated token per step (no assistant model or "
                "prompt lookup)"
            )
        self.active = first

    def before_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """Forward pre-hook of the model: the columns of this call are the cache length and the new inputs."""
        new = kwargs.get("input_ids")
        if new is None:
            new = kwargs.get("inputs_embeds")
        if new is None and args:
            new = args[0]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = 0 if cache is None else cache.get_seq_length()
        self.open_for(past, new.shape[1])

    def gated(self, index: int, forward: Callable[..., Any]) -> Callable[..., Any]:
        """``forward`` of decoder layer ``index``, returning its input unchanged when the layer does not run."""

        @functools.wraps(forward)
        def run_or_skip(*args: Any, **kwargs: Any) -> Any:
            if index in self.active:
                return forward(*args, **kwargs)
            return args[0] if args else kwargs["hidden_states"]

        run_or_skip.skip_gate = True
        return run_or_skip


@contextmanager
def skipping(model: nn.Module, prompt_length: int) -> Iterator[ColumnGate]:
    """Gate ``model``'s decoder layers by its ``config.json`` schedule for prompts ending at ``prompt_length``."""
    prompt_layers, table = read_schedule(model.config)
    layers = decoder_layers(model)
    if len(layers) != model.config.num_hidden_layers:
        raise SkipScheduleError(f"the model has {len(layers)} decoder layers but config.json num_hidden_layers="
                                f"{model.config.num_hidden_layers}")
    own = [vars(layer).get("forward") for layer in layers]  # instance-level forwards, e.g. accelerate's hooks
    if any(getattr(forward, "skip_gate", False) for forward in own):
        raise SkipScheduleError("the decoder layers are already gated: generate() under the skip schedule does not "
                                "nest (an assistant model must be another model object)")
    gate = ColumnGate(prompt_length, prompt_layers, table)
    hook = model.register_forward_pre_hook(gate.before_forward, with_kwargs=True)
    try:
        for index, layer in enumerate(layers):
            layer.forward = gate.gated(index, layer.forward)
        yield gate
    finally:
        hook.remove()
        for layer, forward in zip(layers, own, strict=True):
            if forward is None:
                vars(layer).pop("forward", None)
            else:
                layer.forward = forward


def _prompt(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    for value in (*args[:1], kwargs.get("inputs"), kwargs.get("input_ids"), kwargs.get("inputs_embeds")):
        if value is not None:
            return value
    raise SkipScheduleError("generate() under the skip schedule needs the prompt: pass input_ids (or inputs_embeds)")


def encode_sources(model: nn.Module, sources: Sequence[Source], tokenizer: Any) -> dict[str, torch.Tensor]:
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


def generate(*args: Any, model: nn.Module, sources: Sequence[Source] | None = None, **kwargs: Any) -> Any:
    """transformers' ``generate`` with every decoder layer run only for the columns whose executed set holds it.

    Takes (besides ``model``, which transformers passes by keyword, and ``sources``, see :func:`encode_sources`)
    and returns exactly what ``GenerationMixin.generate`` does. Prompts must be left-padded (every row's prompt
    ends at the last input column) and decoding must start from an empty cache.

    Raises:
        SkipScheduleError: for a malformed schedule, an unsupported family, right padding, a non-empty cache passed
            in, or a forward call whose columns need different layer sets.
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
    with skipping(model, prompt.shape[1]):
        return GenerationMixin.generate(model, *args, **kwargs)
