"""Skip-aware vLLM model classes: each token runs only the decoder layers its generated index executes.

A token at position ``p`` of a request whose prompt has ``P`` tokens has generated index ``g = p - P``: prompt tokens
(``g < 0``) run ``prompt_layers``, the others ``executed_layers[min(g, len - 1)]``, the export's schedule
(``skip_schedule`` in ``config.json``, checked by :func:`~skiptrain.shipped.schedule.read_schedule` when the
engine starts). So it holds under vLLM's continuous batching: requests at different generated indices share a step,
chunked prefill splits prompts, and a preempted request re-prefilled as prompt plus output runs each output token's
generated set again.

A layer runs on just the rows of the step's tokens that execute it, with attention metadata built for those rows by
the attention backend's own metadata builder: skipped tokens cost nothing and write no keys and values; their
residual stream passes unchanged. Since the sets are nested (a later generated index runs a subset of an earlier
one's layers), a request's rows that run a layer are the first of its rows in the step, and every earlier token of
the request ran that layer too, so the rows' attention reads only keys and values that exist. Layers that the same
rows run are grouped, so the rows are gathered and scattered once per group, not per layer. Where vLLM keeps
sliding-window and global layers in KV-cache groups of their own (Gemma 2 and 3), each group's metadata is cut to the
rows by that group's builder.

The forward pass changes shape with the schedule every step, so it runs eagerly (no CUDA graphs, no
``torch.compile``); speculative decoding is refused (see :func:`check_engine`). Prefix caching keys generated blocks
by prompt length (:mod:`skiptrain.serving.vllm_prefix`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from vllm.forward_context import get_forward_context
from vllm.logger import init_logger
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.models.gemma2 import Gemma2ForCausalLM
from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM
from vllm.model_executor.models.gpt2 import GPT2LMHeadModel
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.opt import OPTForCausalLM
from vllm.model_executor.models.phi3 import Phi3ForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.platforms import current_platform
from vllm.v1.attention.backend import CommonAttentionMetadata

from skiptrain.serving.vllm_prompts import prompts_of
from skiptrain.shipped.schedule import CONFIG_KEY, SkipScheduleError, read_schedule

logger = init_logger(f"vllm.{__name__}")  # vLLM configures the handlers of "vllm" loggers

State = tuple[torch.Tensor, ...]
"""What flows between decoder layers: ``(hidden_states, residual)`` (Llama layout), ``(hidden_states,)`` (OPT)."""
LayerCall = Callable[[nn.Module, torch.Tensor, State], State]


def check_engine(vllm_config: Any) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """The export's ``(prompt_layers, executed_layers)``, after refusing engine settings it cannot decode under.

    Raises:
        SkipScheduleError: one line naming the malformed schedule key, or the setting to change and why.
    """
    hf_config = vllm_config.model_config.hf_config
    if getattr(hf_config, CONFIG_KEY, None) is None:
        raise SkipScheduleError(f"{vllm_config.model_config.model} has no '{CONFIG_KEY}' in config.json: the "
                                "skip-aware classes serve skiptrain exports; serve other models without hf_overrides")
    schedule = read_schedule(hf_config)
    if vllm_config.speculative_config is not None:
        raise SkipScheduleError("speculative_config is not supported under a skip schedule: vLLM loads no logits "
                                "processors with speculative decoding, and the schedule needs the prompt lengths one "
                                "of them keeps; serve without speculative decoding")
    if vllm_config.parallel_config.pipeline_parallel_size != 1:
        raise SkipScheduleError(f"pipeline_parallel_size={vllm_config.parallel_config.pipeline_parallel_size} is not "
                                "supported under a skip schedule: allowed 1")
    if not current_platform.is_cpu() and not vllm_config.model_config.enforce_eager:
        raise SkipScheduleError("enforce_eager=False is not supported under a skip schedule: the rows each layer runs "
                                "change every step, which CUDA graphs cannot replay; pass enforce_eager=True "
                                "(vllm serve --enforce-eager)")
    return schedule


def attention_of(layer: nn.Module) -> Attention:
    """The decoder layer's vLLM attention module (whose ``layer_name`` keys the step's attention metadata)."""
    found = [module for module in layer.modules() if isinstance(module, Attention)]
    if len(found) != 1:
        raise SkipScheduleError(f"a decoder layer has {len(found)} vLLM attention modules: the skip-aware classes "
                                "support layers with exactly one")
    return found[0]


@dataclass(frozen=True)
class Group:
    """Consecutive decoder layers run by the same rows of the step's tokens (``rows`` ``None``: all of them)."""

    layers: tuple[int, ...]
    rows: torch.Tensor | None
    codes: tuple[int, ...]
    """The schedule entries (see :attr:`LayerSkipper.sets`) whose tokens are the rows."""


class LayerSkipper:
    """Runs a model's decoder layers under the export's schedule, each on the rows that execute it.

    Args:
        vllm_config: The engine's config (its ``hf_config`` holds the schedule).
        layers: The decoder layers, in order.
        call: Runs one layer on ``(positions, state)`` rows and returns the new state.
    """

    def __init__(self, vllm_config: Any, layers: Sequence[nn.Module], call: LayerCall) -> None:
        prompt_layers, table = check_engine(vllm_config)
        if len(layers) != vllm_config.model_config.hf_config.num_hidden_layers:
            raise SkipScheduleError(f"the model has {len(layers)} decoder layers but config.json num_hidden_layers="
                                    f"{vllm_config.model_config.hf_config.num_hidden_layers}")
        self.vllm_config, self.layers, self.call = vllm_config, list(layers), call
        self.sets = [frozenset(prompt_layers)] + [frozenset(s) for s in table]
        """Code ``0``: prompt tokens; code ``1 + k``: generated index ``k`` (the last entry for every later one)."""
        self.attention = [attention_of(layer) for layer in self.layers]
        self.names = [attention.layer_name for attention in self.attention]
        self.builders: dict[tuple[str, ...], Any] = {}
        logger.info("skiptrain: serving %s under its skip schedule (%d layers for prompt tokens, %s for generated "
                    "tokens)", vllm_config.model_config.model, len(prompt_layers),
                    "/".join(str(len(s)) for s in table[:8]) + ("/..." if len(table) > 8 else ""))

    # -- the step's plan ---------------------------------------------------------------------------------------------
    def codes(self, input_ids: torch.Tensor | None, positions: torch.Tensor, metadata: Any) -> tuple[
            torch.Tensor, torch.Tensor] | None:
        """``(code, request)`` per real token of the step: its schedule entry and its request's batch index.

        ``None`` for a dummy run (no request): every layer runs.

        Raises:
            SkipScheduleError: when the prompt table does not describe this step's requests (a vLLM internal moved).
        """
        table = prompts_of(self.vllm_config)
        if table is None:
            raise SkipScheduleError("skiptrain's prompt-length table was not made: the skiptrain entry point of "
                                    "vllm.logits_processors is not installed (install skiptrain into vLLM's "
                                    "environment: docs/serving.md)")
        if not table.prompts and bool((metadata.slot_mapping < 0).all()):
            return None  # a dummy run (profiling, warm-up): no request, no cache write
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
        count = len(seq_lens)
        if sorted(table.prompts) != list(range(count)):
            raise SkipScheduleError(
                f"skiptrain's prompt-length table holds batch indices {sorted(table.prompts)} for a step of {count} "
                "requests: this vLLM does not hand logits processors the persistent batch the plugin relies on "
                "(supported: skiptrain.serving.vllm_plugin.SUPPORTED_VLLM)")
        lengths = []
        for index in range(count):
            prompt = table.prompts[index]
            begin, end = starts[index], starts[index + 1]
            first = seq_lens[index] - (end - begin)  # position of the request's first token in this step
            if end > begin and int(positions[begin]) != first:
                raise SkipScheduleError(f"request {index} starts at position {int(positions[begin])}, but its "
                                        f"attention metadata says {first}: unsupported vLLM internals")
            if input_ids is not None and first < len(prompt):
                span = min(end - begin, len(prompt) - first)
                if input_ids[begin:begin + span].tolist() != prompt[first:first + span]:
                    raise SkipScheduleError(f"request {index}'s prompt tokens in this step are not those skiptrain's "
                                            "prompt-length table holds for its batch index: unsupported vLLM internals")
            lengths.append(len(prompt))
        sizes = torch.tensor([starts[i + 1] - starts[i] for i in range(count)])
        request = torch.repeat_interleave(torch.arange(count), sizes)
        generated = positions[: len(request)].cpu() - torch.tensor(lengths)[request]
        code = torch.where(generated < 0, 0, 1 + generated.clamp(min=0, max=len(self.sets) - 2))
        return code, request

    def groups(self, code: torch.Tensor) -> list[Group]:
        """The layers grouped by the rows that run them; layers no row runs are left out."""
        present = sorted(set(code.tolist()))
        groups: list[Group] = []
        previous: tuple[int, ...] | None = None
        for index in range(len(self.layers)):
            key = tuple(c for c in present if index in self.sets[c])
            if not key:
                previous = None
                continue
            if key == previous:
                groups[-1] = Group((*groups[-1].layers, index), groups[-1].rows, key)
                continue
            rows = None if len(key) == len(present) else torch.isin(code, torch.tensor(key)).nonzero().squeeze(1)
            groups.append(Group((index,), rows, key))
            previous = key
        return groups

    # -- attention metadata for a subset of rows ---------------------------------------------------------------------
    def metadata_builder(self, names: tuple[str, ...]) -> Any:
        """The attention backend's metadata builder for the layers ``names`` of one KV-cache group (made once)."""
        if names not in self.builders:
            attention = self.attention[self.names.index(names[0])]
            spec = attention.get_kv_cache_spec(self.vllm_config)
            builder_class = attention.attn_backend.get_builder_cls()
            self.builders[names] = builder_class(spec, list(names), self.vllm_config,
                                                 torch.device(current_platform.device_type))
        return self.builders[names]

    def subset_metadata(self, metadata: Any, names: tuple[str, ...], rows: torch.Tensor, request: torch.Tensor,
                        positions: torch.Tensor) -> Any:
        """Attention metadata of just ``rows`` (of the KV-cache group of the layers ``names``): each request keeps
        its first rows, and its context ends after them."""
        device = metadata.seq_lens.device
        count = len(metadata.seq_lens)
        kept = torch.bincount(request[rows], minlength=count)
        full = (metadata.query_start_loc[1:] - metadata.query_start_loc[:-1]).cpu()
        live = (kept > 0).nonzero().squeeze(1)
        seq_lens = (metadata.seq_lens.cpu() - (full - kept).to(metadata.seq_lens.dtype))[live]
        query_lens = kept[live].to(metadata.query_start_loc.dtype)
        query_start = torch.zeros(len(live) + 1, dtype=metadata.query_start_loc.dtype)
        torch.cumsum(query_lens, 0, out=query_start[1:])
        at = rows.to(device)
        common = CommonAttentionMetadata(
            query_start_loc=query_start.to(device), query_start_loc_cpu=query_start, seq_lens=seq_lens.to(device),
            num_reqs=len(live), num_actual_tokens=len(rows), max_query_len=int(query_lens.max()),
            max_seq_len=int(seq_lens.max()), block_table_tensor=metadata.block_table[live.to(device)],
            slot_mapping=metadata.slot_mapping[at], causal=True, positions=positions[at],
            seq_lens_cpu_upper_bound=seq_lens,
        )
        return self.metadata_builder(names).build(common_prefix_len=0, common_attn_metadata=common)

    # -- the forward pass --------------------------------------------------------------------------------------------
    def every_layer(self, positions: torch.Tensor, state: State) -> State:
        for layer in self.layers:
            state = self.call(layer, positions, state)
        return state

    def kv_groups(self, per_layer: dict[str, Any]) -> list[tuple[str, ...]]:
        """Each layer's KV-cache group, as the names of the layers sharing its attention metadata (vLLM's hybrid KV
        cache puts sliding-window and global layers in different groups, each with its own block table)."""
        sharing: dict[int, list[str]] = {}
        for name in self.names:
            sharing.setdefault(id(per_layer[name]), []).append(name)
        return [tuple(sharing[id(per_layer[name])]) for name in self.names]

    def run(self, input_ids: torch.Tensor | None, positions: torch.Tensor, state: State) -> State:
        """Run every decoder layer on the rows that execute it; the state of the other rows passes unchanged."""
        context = get_forward_context()
        per_layer = context.attn_metadata
        if not per_layer:  # profiling and warm-up runs have no requests: every layer, every row
            return self.every_layer(positions, state)
        if not isinstance(per_layer, dict):
            raise SkipScheduleError(f"attention metadata of type {type(per_layer).__name__} is not supported under a "
                                    "skip schedule: allowed one per layer (no speculative decoding, no micro-batching)")
        planned = self.codes(input_ids, positions, per_layer[self.names[0]])
        if planned is None:
            return self.every_layer(positions, state)
        code, request = planned
        slots = context.slot_mapping
        saved = {name: (per_layer[name], slots.get(name)) for name in self.names}
        kv_groups = self.kv_groups(per_layer)
        subsets: dict[tuple[tuple[int, ...], tuple[str, ...]], Any] = {}  # per row set and KV-cache group
        try:
            for group in self.groups(code):
                if group.rows is None:
                    for index in group.layers:
                        state = self.call(self.layers[index], positions, state)
                    continue
                for index in group.layers:
                    name, key = self.names[index], (group.codes, kv_groups[index])
                    if key not in subsets:
                        subsets[key] = self.subset_metadata(saved[name][0], key[1], group.rows, request, positions)
                    per_layer[name] = subsets[key]
                    slots[name] = subsets[key].slot_mapping
                at = group.rows.to(positions.device)
                rows = tuple(tensor[at] for tensor in state)
                for index in group.layers:
                    rows = self.call(self.layers[index], positions[at], rows)
                state = tuple(tensor.index_copy(0, at, part) for tensor, part in zip(state, rows, strict=True))
        finally:
            for name, (layer_metadata, layer_slots) in saved.items():
                per_layer[name] = layer_metadata
                slots[name] = layer_slots
        return state


# -- the families ----------------------------------------------------------------------------------------------------
def llama_layer(layer: nn.Module, positions: torch.Tensor, state: State) -> State:
    """A Llama-family layer on ``(hidden_states, residual)``; the first layer starts the residual."""
    hidden, residual = state if len(state) == 2 else (state[0], None)
    return layer(positions, hidden, residual)


def own_residual_layer(layer: nn.Module, positions: torch.Tensor, state: State) -> State:
    """An OPT or GPT-2 layer: it adds its own residual, so the state is the hidden states alone."""
    return (layer(state[0]),)


class _SkipLlamaFamily:
    """The Llama layout (``model.embed_input_ids``, ``model.layers`` on ``(positions, hidden, residual)``,
    ``model.norm``) under the schedule. Gemma's embedding scaling is in its ``embed_input_ids``, its soft-capping of
    attention logits in its attention modules and of final logits in its ``compute_logits``: vLLM's own code."""

    model: nn.Module

    def __init__(self, *, vllm_config: Any, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self.skipper = LayerSkipper(vllm_config, self.model.layers, llama_layer)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        hidden = inputs_embeds if inputs_embeds is not None else self.model.embed_input_ids(input_ids)
        hidden, residual = self.skipper.run(input_ids, positions, (hidden,))
        hidden, _ = self.model.norm(hidden, residual)
        return hidden


class SkipLlamaForCausalLM(_SkipLlamaFamily, LlamaForCausalLM):
    """Llama (and SmolLM2) under the export's skip schedule."""


class SkipMistralForCausalLM(_SkipLlamaFamily, MistralForCausalLM):
    """Mistral under the export's skip schedule."""


class SkipQwen2ForCausalLM(_SkipLlamaFamily, Qwen2ForCausalLM):
    """Qwen2 under the export's skip schedule."""


class SkipQwen3ForCausalLM(_SkipLlamaFamily, Qwen3ForCausalLM):
    """Qwen3 (its q/k norms inside the attention) under the export's skip schedule."""


class SkipPhi3ForCausalLM(_SkipLlamaFamily, Phi3ForCausalLM):
    """Phi-3 (fused q/k/v and gate/up projections) under the export's skip schedule."""


class SkipGemma2ForCausalLM(_SkipLlamaFamily, Gemma2ForCausalLM):
    """Gemma 2 (sliding and global layers alternating, both soft-cappings) under the export's skip schedule."""


class SkipGemma3ForCausalLM(_SkipLlamaFamily, Gemma3ForCausalLM):
    """Gemma 3 text (sliding and global layers, each kind with its rotary base) under the export's skip schedule."""


class SkipOPTForCausalLM(OPTForCausalLM):
    """OPT under the export's skip schedule."""

    def __init__(self, *, vllm_config: Any, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self.skipper = LayerSkipper(vllm_config, self.model.decoder.layers, own_residual_layer)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        decoder = self.model.decoder
        embeds = inputs_embeds if inputs_embeds is not None else decoder.embed_input_ids(input_ids)
        if decoder.project_in is not None:
            embeds, _ = decoder.project_in(embeds)
        (hidden,) = self.skipper.run(input_ids, positions, (embeds + decoder.embed_positions(positions),))
        if decoder.final_layer_norm is not None:
            hidden = decoder.final_layer_norm(hidden)
        if decoder.project_out is not None:
            hidden, _ = decoder.project_out(hidden)
        return hidden


class SkipGPT2LMHeadModel(GPT2LMHeadModel):
    """GPT-2 under the export's skip schedule."""

    def __init__(self, *, vllm_config: Any, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        self.skipper = LayerSkipper(vllm_config, self.transformer.h, own_residual_layer)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        body = self.transformer
        embeds = inputs_embeds if inputs_embeds is not None else body.embed_input_ids(input_ids)
        (hidden,) = self.skipper.run(input_ids, positions, (embeds + body.wpe(positions),))
        return body.ln_f(hidden)


__all__ = ["LayerSkipper", "SkipGPT2LMHeadModel", "SkipGemma2ForCausalLM", "SkipGemma3ForCausalLM",
           "SkipLlamaForCausalLM", "SkipMistralForCausalLM", "SkipOPTForCausalLM", "SkipPhi3ForCausalLM",
           "SkipQwen2ForCausalLM", "SkipQwen3ForCausalLM", "check_engine"]
