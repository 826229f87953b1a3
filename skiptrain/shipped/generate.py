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
cache entry (by nesting, no later token runs it); the cache decoded into, a :class:`SkipCache`, sizes the attention
masks by the layers that still run (Gemma's sliding and global layers). A call whose columns need different sets
(chunked verification in assisted decoding, or ``use_cache=False`` past the first token when the prompt runs deeper
than ``E(0)``) cannot be applied layer by layer and is refused, as are unsupported model families and malformed
schedules.

With ``speculative_tokens=K`` (K >= 1) the output is instead exactly full-depth decoding, and the schedule only buys
speed (lossless self-speculative decoding, :func:`speculate`): the schedule drafts K tokens one column at a time,
one full-depth forward over those K + 1 columns verifies them, and the longest agreeing prefix is kept (greedy), or
the rejection rule of Leviathan et al. (arXiv 2211.17192) decides (sampling), so the output distribution is the
full-depth one. One KV cache serves both: before verification every layer is cut back to the columns verified
before, so afterwards it holds full-depth keys and values for every column; a row's rejected columns are then
masked as padding. skiptrain's own speculative decoder (``skiptrain.frontends.speculative``) runs the same
:func:`speculate` loop.

``generate(sources=[...], tokenizer=tokenizer)`` takes bare sources instead of ``input_ids``: the export's recorded
prompt format (``skip_schedule.prompt_format``, applied by the shipped ``prompt_format.py``) makes from each the
prompt ids that training made, left-padded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from transformers import DynamicCache, GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    NoRepeatNGramLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

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
    "gemma2": "model.layers",
    "gemma3_text": "model.layers",
    "phi3": "model.layers",
    "opt": "model.decoder.layers",
    "gpt2": "transformer.h",
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


def _has_layer_kinds(config: Any) -> bool:
    """Whether a model mixes sliding-window and global attention layers (Gemma 2 and 3)."""
    return len(set(getattr(config, "layer_types", None) or ())) > 1


def _decode_into_skip_cache(model: nn.Module, kwargs: dict[str, Any]) -> None:
    """Give ``generate`` ``kwargs`` a :class:`SkipCache` where transformers would make a ``DynamicCache``, and where
    a model with sliding-window and global layers would get a static cache only because its generation config
    defaults to one (Gemma checkpoints ask for ``"hybrid"``): the tokens are the same, and its masks are right.

    Raises:
        SkipScheduleError: for a model with layer kinds given another cache, or asked for another
            ``cache_implementation`` (as an argument or in the ``generation_config`` passed).
    """
    layer_kinds = _has_layer_kinds(model.config)
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
    kwargs["cache"] = SkipCache(config=model.config.get_text_config(decoder=True))


def _own_forwards(layers: nn.ModuleList) -> list[Any]:
    """The layers' instance-level forwards (e.g. accelerate's hooks), refused when they are gates already."""
    own = [vars(layer).get("forward") for layer in layers]
    if any(getattr(forward, "skip_gate", False) for forward in own):
        raise SkipScheduleError("the decoder layers are already gated: generate() under the skip schedule does not "
                                "nest (an assistant model must be another model object)")
    return own


def _checked_layers(model: nn.Module) -> nn.ModuleList:
    layers = decoder_layers(model)
    if len(layers) != model.config.num_hidden_layers:
        raise SkipScheduleError(f"the model has {len(layers)} decoder layers but config.json num_hidden_layers="
                                f"{model.config.num_hidden_layers}")
    return layers


@contextmanager
def skipping(model: nn.Module, prompt_length: int) -> Iterator[ColumnGate]:
    """Gate ``model``'s decoder layers by its ``config.json`` schedule for prompts ending at ``prompt_length``."""
    prompt_layers, table = read_schedule(model.config)
    layers = _checked_layers(model)
    own = _own_forwards(layers)
    gate = ColumnGate(prompt_length, prompt_layers, table)
    hook = model.register_forward_pre_hook(gate.before_forward, with_kwargs=True)
    try:
        with _gates_installed(layers, own, gate):
            yield gate
    finally:
        hook.remove()


@contextmanager
def _gates_installed(layers: nn.ModuleList, own: list[Any], gate: ColumnGate) -> Iterator[None]:
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


class GeneratedNGramBlocker(LogitsProcessor):
    """transformers' ``NoRepeatNGramLogitsProcessor`` over the generated tokens only (skiptrain's
    ``sampling.block_repeated_ngrams``): a decoder-only model's input ids start with the prompt, so
    ``no_repeat_ngram_size`` would also forbid a summary to copy from its article."""

    def __init__(self, ngram_size: int, prompt_length: int) -> None:
        self.blocker, self.prompt_length = NoRepeatNGramLogitsProcessor(ngram_size), prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return self.blocker(input_ids[:, self.prompt_length:], scores)


def generate(*args: Any, model: nn.Module, sources: Sequence[Source] | None = None, speculative_tokens: int = 0,
             block_repeated_ngrams: int = 0, **kwargs: Any) -> Any:
    """transformers' ``generate`` with every decoder layer run only for the columns whose executed set holds it.

    Takes (besides ``model``, which transformers passes by keyword, and ``sources``, see :func:`encode_sources`)
    and returns exactly what ``GenerationMixin.generate`` does. Prompts must be left-padded (every row's prompt
    ends at the last input column) and decoding must start from an empty cache.

    With ``speculative_tokens=K >= 1`` the output is full-depth decoding's, drafted K tokens at a time under the
    schedule (:func:`speculative_generate`). With ``block_repeated_ngrams=N >= 1`` no row generates N tokens in a row
    that it has already generated (:class:`GeneratedNGramBlocker`; not with ``speculative_tokens``).

    Raises:
        SkipScheduleError: for a malformed schedule, an unsupported family, right padding, a non-empty cache passed
            in (for a model with sliding-window and global layers, any cache but a :class:`SkipCache`), or a forward
            call whose columns need different layer sets.
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
    if speculative_tokens:
        return speculative_generate(model, prompt, speculative_tokens, **kwargs)
    if block_repeated_ngrams:  # the input ids transformers gives processors start with the prompt (none for embeds)
        prompt_ids = 0 if prompt.is_floating_point() else prompt.shape[1]
        kwargs["logits_processor"] = LogitsProcessorList(
            [*(kwargs.get("logits_processor") or []), GeneratedNGramBlocker(block_repeated_ngrams, prompt_ids)])
    _decode_into_skip_cache(model, kwargs)
    with skipping(model, prompt.shape[1]):
        return GenerationMixin.generate(model, *args, **kwargs)


# -- lossless self-speculative decoding ---------------------------------------------------------------------------
class SpeculativeSteps(Protocol):
    """The forward calls :func:`speculate` makes, on one KV cache (logits as float32)."""

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Run the prompts ``[B, P]`` at full depth into the empty cache; logits ``[B, V]`` of the first token."""

    def draft(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, index: int) -> torch.Tensor:
        """Run one column ``[B, 1]`` through the draft's layers for generated index ``index``; logits ``[B, V]``."""

    def verify(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past: int) -> torch.Tensor:
        """Cut every layer's cache to ``past`` columns, run ``[B, q]`` columns at full depth; logits ``[B, q, V]``."""


@dataclass
class SpeculationStats:
    """Counts of one speculative decode, over the rows still generating at each verification.

    Attributes:
        verifications: Full-depth verification forwards (all rows together).
        draft_steps: Draft forwards (one column each, all rows together).
        judged: Draft tokens the verifier judged: each row's drafts up to and including its first rejected one.
        accepted: Draft tokens the verifier accepted.
        row_verifications: Verifications counted once per row still generating.
        committed: Tokens kept, over all rows and verifications.
    """

    verifications: int = 0
    draft_steps: int = 0
    judged: int = 0
    accepted: int = 0
    row_verifications: int = 0
    committed: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted over judged drafts: the per-token acceptance probability ``a`` of Leviathan et al."""
        return self.accepted / self.judged if self.judged else 0.0

    @property
    def tokens_per_verification(self) -> float:
        """Tokens a row keeps per verification."""
        return self.committed / self.row_verifications if self.row_verifications else 0.0

    def add(self, other: SpeculationStats) -> SpeculationStats:
        """The counts of both decodes."""
        return SpeculationStats(*(getattr(self, name) + getattr(other, name) for name in vars(self)))


def speedup_bound(acceptance: float, draft_tokens: int, draft_cost: float) -> float:
    """``(1 - a^(K+1)) / ((1 - a)(K c + 1))``: expected tokens per verification over its cost in full-depth steps.

    Args:
        acceptance: ``a``, the per-token acceptance probability.
        draft_tokens: ``K``, draft tokens per verification.
        draft_cost: ``c``, a draft step's cost relative to a full-depth step (verification counted as one step).
    """
    tokens = draft_tokens + 1 if acceptance >= 1 else (1 - acceptance ** (draft_tokens + 1)) / (1 - acceptance)
    return tokens / (draft_tokens * draft_cost + 1)


def greedy_acceptance(verified: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy rule: keep drafts while they equal the full-depth argmax.

    Args:
        verified: ``[B, k + 1, V]`` full-depth logits at the column before each draft, and after the last.
        drafts: ``[B, k]`` draft tokens.

    Returns:
        ``(tokens [B, k + 1], accepted [B])``: row ``b``'s exact tokens are ``tokens[b, :accepted[b] + 1]``.
    """
    tokens = verified.argmax(-1)  # [B, k + 1]
    accepted = (drafts == tokens[:, :-1]).long().cumprod(1).sum(1)  # [B]
    return tokens, accepted


def sampled_acceptance(
    verified: torch.Tensor, drafted: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection rule of Leviathan et al.: each token's distribution is the full-depth ``p``.

    Draft ``d ~ q`` is accepted with probability ``min(1, p(d) / q(d))``; the first rejected one is replaced by a
    sample of ``max(p - q, 0)`` (normalised), and when all are accepted one more token is sampled from ``p``.

    Args:
        verified: ``[B, k + 1, V]`` full-depth probabilities ``p`` (after the logits warpers).
        drafted: ``[B, k, V]`` draft probabilities ``q`` the drafts were sampled from.
        drafts: ``[B, k]`` draft tokens.
        generator: Random generator.

    Returns:
        As :func:`greedy_acceptance`.
    """
    batch, width, vocab = verified.shape
    p_draft = verified[:, :-1].gather(-1, drafts[..., None]).squeeze(-1)  # [B, k]
    q_draft = drafted.gather(-1, drafts[..., None]).squeeze(-1)  # [B, k]
    uniform = torch.rand(p_draft.shape, generator=generator, device=verified.device)
    accepted = (uniform * q_draft < p_draft).long().cumprod(1).sum(1)  # [B]
    residual = torch.cat([(verified[:, :-1] - drafted).clamp(min=0), verified[:, -1:]], dim=1)  # [B, k + 1, V]
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, verified)  # p == q: nothing to correct
    replaced = torch.multinomial(residual.reshape(-1, vocab), 1, generator=generator).view(batch, width)
    tokens = torch.cat([drafts, replaced[:, -1:]], dim=1)
    rows = torch.arange(batch, device=verified.device)
    tokens[rows, accepted] = replaced[rows, accepted]
    return tokens, accepted


@torch.no_grad()
def speculate(
    steps: SpeculativeSteps,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    draft_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int = 0,
    do_sample: bool = False,
    warpers: LogitsProcessorList | None = None,
    generator: torch.Generator | None = None,
    batch_minimum: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, SpeculationStats]:
    """Decode left-padded prompts: the full-depth output, drafted ``draft_tokens`` tokens per verification.

    All rows draft and verify the same columns, so one cache serves the batch; each row keeps its own exact tokens
    and its rejected columns become padding (attention mask 0), so a row's tokens are its full-depth tokens whatever
    the other rows accept. A draft column runs the draft's layers for the generated index of the row furthest
    behind (by nesting, a superset of every row's own). Rows end at an end-of-sequence token (then
    ``pad_token_id``) or at ``max_new_tokens``, as :func:`transformers` ``generate`` and skiptrain's ``generate``.

    Args:
        steps: The forward calls on one cache (:class:`SpeculativeSteps`).
        input_ids: ``[B, P]`` prompts, left-padded.
        attention_mask: ``[B, P]``.
        max_new_tokens: Tokens per row at most.
        draft_tokens: ``K >= 0`` drafts per verification (0: full-depth decoding one token per step).
        eos_token_id: Token id(s) that end a row.
        pad_token_id: Filler after a row's end.
        do_sample: Sample (rejection rule) instead of greedy.
        warpers: transformers' logits warpers (temperature, top-k, top-p; they read no sequence), applied to draft
            and full depth alike.
        generator: Random generator for sampling.
        batch_minimum: Every row keeps only as many tokens as the row that keeps fewest (rows that end aside):
            also lossless, and slower; kept to measure what per-row bookkeeping buys.

    Returns:
        ``(tokens [B, G], lengths [B], stats)``.
    """
    device = input_ids.device
    eos = torch.tensor([] if eos_token_id is None else eos_token_id, device=device).flatten()
    batch, past = input_ids.shape
    rows = torch.arange(batch, device=device)

    def probabilities(logits: torch.Tensor) -> torch.Tensor:  # [..., V] -> warped softmax
        flat = logits.reshape(-1, logits.shape[-1])
        if warpers:
            flat = warpers(flat.new_zeros(len(flat), 0, dtype=torch.long), flat)
        return flat.softmax(-1).view(logits.shape)

    stats = SpeculationStats()
    first = steps.prefill(input_ids, attention_mask)
    token = torch.multinomial(probabilities(first), 1, generator=generator).squeeze(1) if do_sample \
        else first.argmax(-1)  # [B]
    tokens = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    tokens[:, 0] = token
    counts = torch.ones(batch, dtype=torch.long, device=device)  # tokens generated per row
    finished = torch.isin(token, eos) | (counts >= max_new_tokens)
    mask = attention_mask
    ones = torch.ones(batch, draft_tokens + 1, dtype=mask.dtype, device=device)
    while not bool(finished.all()):
        active, remaining = ~finished, max_new_tokens - counts
        k = min(draft_tokens, int(remaining[active].max()) - 1)
        index = int(counts[active].min()) - 1  # generated index of the fed token of the row furthest behind
        column, drafts, drafted = token, [], []
        for j in range(k):
            logits = steps.draft(column[:, None], torch.cat([mask, ones[:, : j + 1]], dim=1), index + j)
            if do_sample:
                drafted.append(probabilities(logits))
                column = torch.multinomial(drafted[-1], 1, generator=generator).squeeze(1)
            else:
                column = logits.argmax(-1)
            drafts.append(column)
        draft = torch.stack(drafts, 1) if drafts else token.new_zeros(batch, 0)  # [B, k]
        verified = steps.verify(torch.cat([token[:, None], draft], 1), torch.cat([mask, ones[:, : k + 1]], 1), past)
        if do_sample:
            drafted_probs = torch.stack(drafted, 1) if drafted else verified.new_zeros(batch, 0, verified.shape[-1])
            chosen, accepted = sampled_acceptance(probabilities(verified), drafted_probs, draft, generator)
        else:
            chosen, accepted = greedy_acceptance(verified, draft)
        width = torch.arange(k + 1, device=device)
        exact = width <= accepted[:, None]  # [B, k + 1]
        ends = torch.isin(chosen, eos) & exact
        kept = torch.where(ends.any(1), ends.int().argmax(1) + 1, accepted + 1).minimum(remaining)
        kept = kept.masked_fill(finished, 0)
        if batch_minimum:
            open_rows = active & (kept == accepted + 1) & (kept < remaining)  # rows that neither end nor fill up
            if bool(open_rows.any()):
                kept = kept.minimum(kept[open_rows].min())
        keep = width < kept[:, None]  # [B, k + 1]
        tokens[rows[:, None].expand_as(keep)[keep], (counts[:, None] + width)[keep]] = chosen[keep]
        counts += kept
        finished |= (torch.isin(chosen, eos) & keep).any(1) | (counts >= max_new_tokens)
        stats.verifications += 1
        stats.draft_steps += k
        stats.judged += int(torch.minimum(accepted + 1, torch.full_like(accepted, k))[active].sum())
        stats.accepted += int(accepted[active].sum())
        stats.row_verifications += int(active.sum())
        stats.committed += int(kept.sum())
        mask = torch.cat([mask, keep.to(mask.dtype)], dim=1)  # rejected columns become padding
        past += k + 1
        token = chosen[rows, (kept - 1).clamp(min=0)].masked_fill(kept == 0, pad_token_id)
    width = int(counts.max())
    return tokens[:, :width], counts, stats


def sliding_window_of(config: Any) -> int | None:
    """The sliding attention window of a model config, ``None`` for full attention in every layer.

    Speculative decoding refuses such models: a row's rejected columns stay in the cache as padding, and a window
    counted in cache columns would then cover fewer of that row's tokens than full-depth decoding sees.
    """
    window = getattr(config, "sliding_window", None)
    sliding = "sliding_attention" in (getattr(config, "layer_types", None) or ()) or (
        window is not None and getattr(config, "use_sliding_window", True))
    return window if sliding else None


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Cut every layer of ``cache`` to its first ``length`` columns (layers differ in length after a draft)."""
    for layer in cache.layers:
        layer.crop(min(0, length - layer.get_seq_length()))


class GatedSteps:
    """:class:`SpeculativeSteps` through the model's own forward, decoder layers gated by a :class:`ColumnGate`.

    A draft for generated index ``g`` runs ``executed_layers[g]``; prefill and verification run every layer.

    Args:
        model: The exported causal LM (its layers gated while decoding).
        gate: The gate of its layers; its ``active`` set is chosen here per call.
    """

    def __init__(self, model: nn.Module, gate: ColumnGate) -> None:
        self.model, self.gate = model, gate
        self.cache = SkipCache(config=model.config)
        self.every_layer = frozenset(range(model.config.num_hidden_layers))

    def _logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: frozenset[int],
                last_only: bool) -> torch.Tensor:
        self.gate.active = layers
        past = self.cache.get_seq_length()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # as transformers' generate
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                            cache=self.cache, use_cache=True, logits_to_keep=int(last_only)).logits
        return (logits[:, -1] if last_only else logits).float()

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._logits(input_ids, attention_mask, self.every_layer, last_only=True)

    def draft(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, index: int) -> torch.Tensor:
        layers = frozenset(self.gate.table[min(index, len(self.gate.table) - 1)])
        return self._logits(input_ids, attention_mask, layers, last_only=True)

    def verify(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past: int) -> torch.Tensor:
        crop_cache(self.cache, past)
        return self._logits(input_ids, attention_mask, self.every_layer, last_only=False)


SPECULATIVE_OPTIONS = {"input_ids", "inputs", "attention_mask", "max_new_tokens", "do_sample", "temperature", "top_k",
                       "top_p", "eos_token_id", "pad_token_id", "use_cache", "trust_remote_code", "custom_generate",
                       "tokenizer"}
"""What ``generate(speculative_tokens=K)`` accepts; other options (beam search, processors, streamers) are refused."""


def speculative_generate(model: nn.Module, prompt: torch.Tensor, draft_tokens: int, **kwargs: Any) -> torch.Tensor:
    """Full-depth greedy decoding or sampling, drafted ``draft_tokens`` tokens per verification under the schedule.

    Returns ``[B, P + G]`` sequences (prompt, then the generated tokens, ``pad_token_id`` after a row's end), as
    transformers' ``generate`` does with its default ``return_dict_in_generate=False``. Sampling draws from torch's
    global generator.

    Raises:
        SkipScheduleError: for an option the lossless mode does not take, a missing ``max_new_tokens``, or
            ``speculative_tokens`` above it.
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
    setting = {name: kwargs.get(name, getattr(config, name, None))
               for name in ("do_sample", "temperature", "top_k", "top_p", "eos_token_id", "pad_token_id")}
    warpers = LogitsProcessorList()
    if setting["do_sample"]:
        if setting["temperature"] not in (None, 1.0):
            warpers.append(TemperatureLogitsWarper(setting["temperature"]))
        if setting["top_k"]:
            warpers.append(TopKLogitsWarper(setting["top_k"]))
        if setting["top_p"] not in (None, 1.0):
            warpers.append(TopPLogitsWarper(setting["top_p"]))
    pad = setting["pad_token_id"]
    eos = setting["eos_token_id"]
    mask = kwargs.get("attention_mask")
    mask = torch.ones_like(prompt) if mask is None else mask
    _, table = read_schedule(model.config)
    if sliding_window_of(model.config) is not None:
        raise SkipScheduleError(f"speculative_tokens={draft_tokens} is invalid for sliding-window attention "
                                f"(sliding_window={sliding_window_of(model.config)}): allowed full-attention models; "
                                "decode without speculative_tokens")
    layers = _checked_layers(model)
    gate = ColumnGate(prompt.shape[1], range(len(layers)), table)
    with _gates_installed(layers, _own_forwards(layers), gate):
        tokens, _, _ = speculate(
            GatedSteps(model, gate), prompt, mask, max_new_tokens, draft_tokens, eos,
            pad if pad is not None else 0, do_sample=bool(setting["do_sample"]),
            warpers=warpers,
        )
    return torch.cat([prompt, tokens], dim=1)
