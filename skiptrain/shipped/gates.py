"""Layer gates: each decoder layer runs only for the columns whose executed layer set holds it.

Before each forward call of the model, a hook reads which columns the call brings (the cache length and the number
of new columns) and looks up their executed layer set: prompt columns (left of the prompt end ``P``, the input
length) run ``prompt_layers``; the token at generated index ``g`` (column ``P + g``) runs ``executed_layers[g]``. A
gated layer outside that set returns its input unchanged without running: no work, no cache entry (by nesting, no
later token runs it). A call whose columns need different sets cannot be applied layer by layer and is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch import nn

from .schedule import SkipScheduleError, read_schedule

# model_type -> dotted path from the *ForCausalLM model to its nn.ModuleList of decoder layers
DECODER_LAYERS = {
    "llama": "model.layers",
    "mistral": "model.layers",
    "qwen2": "model.layers",
    "qwen3": "model.layers",
    "gemma2": "model.layers",
    "gemma3_text": "model.layers",
    "phi3": "model.layers",
    "opt": "model.decoder.layers",
    "gpt2": "transformer.h",
}


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a supported family.

    Raises:
        SkipScheduleError: naming the ``model_type`` and the supported ones.
    """
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


def own_forwards(layers: nn.ModuleList) -> list[Any]:
    """The layers' instance-level forwards (e.g. accelerate's hooks), refused when they are gates already."""
    own = [vars(layer).get("forward") for layer in layers]
    if any(getattr(forward, "skip_gate", False) for forward in own):
        raise SkipScheduleError("the decoder layers are already gated: generate() under the skip schedule does not "
                                "nest (an assistant model must be another model object)")
    return own


def checked_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers (:func:`decoder_layers`), refused when they are not ``config.json``'s layer count."""
    layers = decoder_layers(model)
    if len(layers) != model.config.num_hidden_layers:
        raise SkipScheduleError(f"the model has {len(layers)} decoder layers but config.json num_hidden_layers="
                                f"{model.config.num_hidden_layers}")
    return layers


@contextmanager
def skipping(model: nn.Module, prompt_length: int) -> Iterator[ColumnGate]:
    """Gate ``model``'s decoder layers by its ``config.json`` schedule for prompts ending at ``prompt_length``."""
    prompt_layers, table = read_schedule(model.config)
    layers = checked_layers(model)
    own = own_forwards(layers)
    gate = ColumnGate(prompt_length, prompt_layers, table)
    hook = model.register_forward_pre_hook(gate.before_forward, with_kwargs=True)
    try:
        with gates_installed(layers, own, gate):
            yield gate
    finally:
        hook.remove()


@contextmanager
def gates_installed(layers: nn.ModuleList, own: list[Any], gate: ColumnGate) -> Iterator[None]:
    """Route every decoder layer's forward through ``gate`` while inside; restore ``own`` forwards after."""
    try:
        for index, layer in enumerate(layers):
            layer.forward = gate.gated(index, layer.forward)
        yield
    finally:
        for layer, forward in zip(layers, own, strict=True):
            if forward is None:
                vars(layer).pop("forward", None)
            else:
                layer.forward = forward
