"""Prefix caching under a skip schedule: each KV block is keyed by what decides its keys and values.

vLLM keys a cached KV block by the token ids up to its end (a chain of block hashes), and a request whose prompt
starts with the same tokens reuses it instead of prefilling them. Under a skip schedule a token's keys and values also
depend on its request's prompt length: a prompt token runs the prompt layers, as the prefill of any prompt holding
it does, but a generated token runs only the layers of its generated index (its position minus the prompt length),
and the layers under it ran on other inputs. So:

- a block that lies inside the prompt keeps vLLM's key, and is shared with every request whose prompt starts with
  the same tokens (a shared system prompt, the earlier turns of a chat);
- a block that ends past the prompt is keyed by its tokens and the prompt length, so it is reused only where it would
  be computed the same way (the same prompt and generated tokens: a preempted request resuming, an identical request),
  never as the prompt of another request, which would have run every prompt layer on those tokens.

Every block inside the prompt is hashed when its request arrives (vLLM hashes the full blocks a request holds), so a
block hashed later, once the request holds generated tokens, ends past the prompt: the key changes only for those.

vLLM internals this relies on (vLLM 0.32; ``SUPPORTED_VLLM`` in :mod:`skiptrain.serving.vllm_plugin`, checked by
``tests/test_vllm.py``, whose second-turn test fails if a generated block were reused):

- ``vllm.v1.engine.core.EngineCore.preprocess_add_request``, which makes each arriving request (wrapped, once per
  process, by :func:`install`);
- ``EngineCore.request_block_hasher``, the function that hashes a request's new full blocks, and
  ``EngineCore.vllm_config``;
- ``vllm.v1.request.Request.num_tokens`` and ``num_prompt_tokens``; block hashes are ``bytes``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from skiptrain.shipped.schedule import SkipScheduleError

TAG = b"skiptrain generated block, prompt tokens:"


class PromptLengthKeyed:
    """A request's block hasher whose blocks hashed after the prompt's are keyed by the prompt length too."""

    def __init__(self, hasher: Callable[[Any], list[bytes]]) -> None:
        self.hasher = hasher

    def __call__(self, request: Any) -> list[bytes]:
        hashes = self.hasher(request)
        if request.num_tokens == request.num_prompt_tokens:  # the request's arrival: blocks inside its prompt
            return hashes
        salt = TAG + str(request.num_prompt_tokens).encode()
        # the next block's hash chains from this one, so every later block of the request keeps the prompt length
        return [hashlib.sha256(block + salt).digest() for block in hashes]


def install(serves_under_schedule: Callable[[Any], bool]) -> None:
    """Key generated blocks by prompt length in every engine of this process whose config ``serves_under_schedule``
    (:func:`skiptrain.serving.vllm_plugin.serves_under_schedule`)."""
    from vllm.v1.engine.core import EngineCore

    original = EngineCore.preprocess_add_request
    if getattr(original, "skiptrain", False):
        return

    @functools.wraps(original)
    def preprocess_add_request(self: Any, request: Any) -> Any:
        if serves_under_schedule(self.vllm_config) and self.vllm_config.cache_config.enable_prefix_caching:
            hasher = getattr(self, "request_block_hasher", None)
            if not callable(hasher):
                raise SkipScheduleError("enable_prefix_caching=True is not supported under a skip schedule with this "
                                        "vLLM (its engine hashes blocks elsewhere): pass enable_prefix_caching=False "
                                        "(--no-enable-prefix-caching), or use a vLLM in "
                                        "skiptrain.serving.vllm_plugin.SUPPORTED_VLLM")
            if not isinstance(hasher, PromptLengthKeyed):
                self.request_block_hasher = PromptLengthKeyed(hasher)
        return original(self, request)

    preprocess_add_request.skiptrain = True  # type: ignore[attr-defined]
    EngineCore.preprocess_add_request = preprocess_add_request

