"""Each request's prompt length, handed to the skip-aware model by a logits processor that changes no logits.

The generated index of a token (its position minus its request's prompt length) decides its layers, but vLLM gives a
model only positions: the prompt length lives in the model runner. The least private route to it is vLLM's public
logits-processor interface: every engine step, before the forward pass, vLLM tells each logits processor which
requests entered, left or moved within the persistent batch, with their prompt token ids, and the forward pass lays
out its requests in that batch order. :class:`PromptLengths`, loaded from the ``vllm.logits_processors`` entry
point, keeps that table; the model reads it through :func:`prompts_of` (by the engine's config) and checks it
against the step's prompt tokens, so a vLLM that stops keeping this order fails loudly instead of decoding wrong.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from vllm.logger import init_logger
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from skiptrain.serving.vllm_plugin import ARCHITECTURES
from skiptrain.shipped.schedule import CONFIG_KEY

logger = init_logger(f"vllm.{__name__}")  # vLLM configures the handlers of "vllm" loggers

_TABLES: weakref.WeakValueDictionary[int, PromptLengths] = weakref.WeakValueDictionary()
"""``id(vllm_config)`` -> the newest table of that engine (the runner rebuilds its batch once, after profiling)."""


class PromptLengths(LogitsProcessor):
    """The prompt token ids of every request in vLLM's persistent batch, by batch index; logits pass unchanged.

    Inert (one check per step) for models that are not skiptrain exports.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        hf_config = vllm_config.model_config.hf_config
        self.active = getattr(hf_config, CONFIG_KEY, None) is not None
        self.prompts: dict[int, list[int]] = {}
        if not self.active:
            return
        _TABLES[id(vllm_config)] = self
        served = set(vllm_config.model_config.architectures or ())
        if not served & set(ARCHITECTURES.values()):
            logger.warning("skiptrain: %s is an export with a skip schedule, served densely (architectures=%s); "
                           "to decode under its schedule pass hf_overrides={'architectures': [%r]}",
                           vllm_config.model_config.model, sorted(served),
                           next((ARCHITECTURES[a] for a in served if a in ARCHITECTURES), "Skip...ForCausalLM"))

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self.active:
            process_dict_updates(self.prompts, batch_update, lambda params, prompt, output: prompt)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


def prompts_of(vllm_config: Any) -> PromptLengths | None:
    """The prompt table of the engine whose config is ``vllm_config``, ``None`` before its runner made one."""
    return _TABLES.get(id(vllm_config))
