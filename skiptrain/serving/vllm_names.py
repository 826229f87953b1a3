"""The vLLM names the plugin relies on, checked in a vLLM source tree without importing it.

The plugin reaches below vLLM's public API: model classes and their attributes, attention metadata and its builders,
the forward context, the V1 model runner's logits-processor interface. A release that renames or drops one of them
breaks the plugin, and only vLLM's CPU build runs in the tests. This check reads a vLLM package directory (installed,
or unpacked from a wheel or sdist) and names every one that is missing, so a release the tests cannot install is
still checked before ``SUPPORTED_VLLM`` is widened to it (docs/serving.md, "vLLM versions"):

    pip download "vllm==0.33.0" --no-deps -d wheels && unzip -q wheels/vllm-0.33.0-*.whl 'vllm/*.py' -d vllm-0.33
    python -m skiptrain.serving.vllm_names vllm-0.33/vllm

It finds names and call signatures, not behaviour: a release that passes still needs the engine tests where it runs.
The plugin's own ``from vllm... import`` lines are read from its modules; :data:`NEEDS` lists what it uses on them.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_LLAMA_LAYOUT = ("model", "layers", "norm", "embed_input_ids")
NEEDS = (
    # the families: the ForCausalLM class's body, its decoder layers' forward, the norm taking the residual
    *(f"vllm.model_executor.models.{module}:{causal}.__init__(vllm_config, prefix)"
      for module, causal in (("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM"),
                             ("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM"), ("phi3", "Phi3ForCausalLM"),
                             ("gemma2", "Gemma2ForCausalLM"), ("gemma3", "Gemma3ForCausalLM"),
                             ("opt", "OPTForCausalLM"), ("gpt2", "GPT2LMHeadModel"))),
    *(f"vllm.model_executor.models.{module}:{model}.{attr}" for module, model in (
        ("llama", "LlamaModel"), ("mistral", "MistralModel"), ("qwen2", "Qwen2Model"), ("qwen3", "Qwen3Model"),
        ("gemma2", "Gemma2Model"), ("gemma3", "Gemma3Model")) for attr in _LLAMA_LAYOUT[1:]),
    *(f"vllm.model_executor.models.{module}:{causal}.model" for module, causal in (
        ("llama", "LlamaForCausalLM"), ("phi3", "Phi3ForCausalLM"), ("qwen2", "Qwen2ForCausalLM"),
        ("qwen3", "Qwen3ForCausalLM"), ("gemma2", "Gemma2ForCausalLM"), ("gemma3", "Gemma3ForCausalLM"))),
    *(f"vllm.model_executor.models.{module}:{layer}.forward(positions, hidden_states, residual)"
      for module, layer in (("llama", "LlamaDecoderLayer"), ("qwen2", "Qwen2DecoderLayer"),
                            ("qwen3", "Qwen3DecoderLayer"), ("gemma2", "Gemma2DecoderLayer"),
                            ("gemma3", "Gemma3DecoderLayer"))),
    "vllm.model_executor.layers.layernorm:RMSNorm.forward_native(x, residual)",
    "vllm.model_executor.layers.layernorm:GemmaRMSNorm.forward_native(x, residual)",
    "vllm.model_executor.models.opt:OPTForCausalLM.model", "vllm.model_executor.models.opt:OPTModel.decoder",
    *(f"vllm.model_executor.models.opt:OPTDecoder.{attr}" for attr in (
        "layers", "embed_input_ids", "project_in", "embed_positions", "final_layer_norm", "project_out")),
    "vllm.model_executor.models.opt:OPTDecoderLayer.forward(hidden_states)",
    "vllm.model_executor.models.gpt2:GPT2LMHeadModel.transformer",
    *(f"vllm.model_executor.models.gpt2:GPT2Model.{attr}" for attr in ("h", "wpe", "ln_f", "embed_input_ids")),
    "vllm.model_executor.models.gpt2:GPT2Block.forward(hidden_states)",
    "vllm.model_executor.models.registry:_ModelRegistry.register_model(model_arch, model_cls)",
    "vllm.model_executor.models.registry:_ModelRegistry.get_supported_archs()",
    # attention metadata for a subset of rows, built by the backend's own builder
    "vllm.model_executor.layers.attention.attention:Attention.layer_name",
    "vllm.model_executor.layers.attention.attention:Attention.attn_backend",
    "vllm.model_executor.layers.attention.attention:Attention.get_kv_cache_spec(vllm_config)",
    "vllm.v1.attention.backend:AttentionBackend.get_builder_cls()",
    "vllm.v1.attention.backend:AttentionMetadataBuilder.__init__(kv_cache_spec, layer_names, vllm_config, device)",
    "vllm.v1.attention.backend:AttentionMetadataBuilder.build(common_prefix_len, common_attn_metadata)",
    "vllm.v1.attention.backend:CommonAttentionMetadata(query_start_loc, query_start_loc_cpu, seq_lens, num_reqs, "
    "num_actual_tokens, max_query_len, max_seq_len, block_table_tensor, slot_mapping, causal, positions, "
    "seq_lens_cpu_upper_bound)",
    *(f"vllm.v1.attention.backends.{module}:{metadata}.{field}"
      for module, metadata in (("cpu_attn", "CPUAttentionMetadata"), ("flash_attn", "FlashAttentionMetadata"))
      for field in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")),
    "vllm.forward_context:ForwardContext.attn_metadata", "vllm.forward_context:ForwardContext.slot_mapping",
    # the engine settings check_engine reads
    "vllm.config.vllm:VllmConfig.model_config", "vllm.config.vllm:VllmConfig.cache_config",
    "vllm.config.vllm:VllmConfig.speculative_config", "vllm.config.vllm:VllmConfig.parallel_config",
    *(f"vllm.config.model:ModelConfig.{attr}" for attr in ("hf_config", "model", "enforce_eager", "architectures")),
    "vllm.config.cache:CacheConfig.enable_prefix_caching",
    "vllm.config.parallel:ParallelConfig.pipeline_parallel_size",
    "vllm.platforms.interface:Platform.is_cpu", "vllm.platforms.interface:Platform.device_type",
    # the prompt lengths: a V1-interface logits processor, loaded from the entry point by the V1 model runner
    "vllm.plugins:DEFAULT_PLUGINS_GROUP", "vllm.v1.sample.logits_processor:LOGITSPROCS_GROUP",
    "vllm.v1.sample.logits_processor.interface:LogitsProcessor.__init__(vllm_config, device, is_pin_memory)",
    "vllm.v1.sample.logits_processor.interface:LogitsProcessor.update_state(batch_update)",
    "vllm.v1.sample.logits_processor.builtin:process_dict_updates(req_entries, batch_update, new_state)",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
    # prefix caching: each arriving request's block hasher, wrapped to key generated blocks by the prompt length
    "vllm.v1.engine.core:EngineCore.preprocess_add_request(request)", "vllm.v1.engine.core:EngineCore.vllm_config",
    "vllm.v1.engine.core:EngineCore.request_block_hasher", "vllm.v1.request:Request.num_tokens",
    "vllm.v1.request:Request.num_prompt_tokens",
    "vllm.envs:VLLM_USE_V2_MODEL_RUNNER",  # the V1 runner is chosen with VLLM_USE_V2_MODEL_RUNNER=0 on GPUs
)
"""What the plugin uses beyond its imports: ``module:Name``, ``module:Class.attribute``, ``module:Class.method(args)``
(called with exactly these arguments: each is a parameter, every other one has a default) and ``module:Class(fields)``
(a dataclass built from these fields)."""

_NEED = re.compile(r"^(?P<module>[\w.]+):(?P<name>\w+)(?:\.(?P<attr>\w+))?(?:\((?P<args>[\w, ]*)\))?$")


@dataclass(frozen=True)
class Tree:
    """A vLLM package directory (the one holding ``__init__.py``), read as source."""

    root: Path

    @cache  # noqa: B019 - a few dozen modules per tree, for the life of the check
    def module(self, dotted: str) -> ast.Module | None:
        parts = dotted.split(".")[1:]
        for path in (self.root.joinpath(*parts).with_suffix(".py"), self.root.joinpath(*parts, "__init__.py")):
            if path.is_file():
                return ast.parse(path.read_text(encoding="utf-8"))
        return None

    def version(self) -> str:
        for name in ("_version.py", "version.py"):
            path = self.root / name
            found = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)""",
                              path.read_text(encoding="utf-8") if path.is_file() else "")
            if found:
                return found.group(1)
        return "unknown"

    def binding(self, dotted: str, name: str) -> tuple[str, ast.AST] | None:
        """``(module, node)`` where ``dotted`` binds ``name`` at top level, following ``from ... import`` lines."""
        tree = self.module(dotted)
        if tree is None:
            return None
        lazy = False
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return dotted, node
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return dotted, node
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(dotted, node, self.root)
                        return self.binding(source, alias.name) or (source, node)
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                lazy = True
        if lazy and any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(tree)):
            return dotted, tree  # a lazily imported attribute (a module-level __getattr__)
        return None

    def members(self, dotted: str, cls: ast.ClassDef) -> dict[str, ast.AST]:
        """The class's attributes (its body, ``self.x =`` in its methods) and its bases', nearest first."""
        found: dict[str, ast.AST] = {}
        for base in reversed(cls.bases):
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            bound = self.binding(dotted, name) if name else None
            if bound and isinstance(bound[1], ast.ClassDef):
                found.update(self.members(*bound))
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[node.name] = node
                for inner in ast.walk(node):
                    for target in _targets(inner):
                        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                                and target.value.id == "self"):
                            found.setdefault(target.attr, inner)
            for target in _targets(node):
                if isinstance(target, ast.Name):
                    found[target.id] = node
        return found

    def fields(self, dotted: str, cls: ast.ClassDef) -> dict[str, bool]:
        """A dataclass's fields (its bases' first) and whether each has a default."""
        found: dict[str, bool] = {}
        for base in cls.bases:
            bound = self.binding(dotted, base.id) if isinstance(base, ast.Name) else None
            if bound and isinstance(bound[1], ast.ClassDef):
                found.update(self.fields(*bound))
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found[node.target.id] = node.value is not None
        return found

    def missing(self, need: str) -> str | None:
        """Why ``need`` (an entry of :data:`NEEDS`, or ``module:Name``) is not met, ``None`` when it is."""
        parsed = _NEED.match(need)
        if parsed is None:
            raise ValueError(f"malformed need {need!r}")
        module, name, attr, args = parsed.group("module", "name", "attr", "args")
        if self.module(module) is None:
            return f"{need}: no module {module}"
        bound = self.binding(module, name)
        if bound is None:
            return f"{need}: {module} has no {name}"
        if attr is None and args is None:
            return None
        if not isinstance(bound[1], ast.ClassDef | ast.FunctionDef):
            return f"{need}: {module}.{name} is not a class or function here"
        wanted = [a.strip() for a in args.split(",") if a.strip()] if args is not None else None
        if attr is None and isinstance(bound[1], ast.ClassDef):  # a dataclass built from fields
            fields = self.fields(*bound)
            unknown = [w for w in wanted or () if w not in fields]
            required = [f for f, has_default in fields.items() if not has_default and f not in (wanted or ())]
            if unknown or required:
                return f"{need}: unknown fields {unknown}, required fields not given {required}"
            return None
        member = self.members(*bound).get(attr) if isinstance(bound[1], ast.ClassDef) else bound[1]
        if member is None:
            return f"{need}: {name} has no attribute {attr}"
        if wanted is None:
            return None
        if not isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
            return f"{need}: {name}.{attr} is not a method"
        return _call_mismatch(need, member.args, wanted, is_method=isinstance(bound[1], ast.ClassDef))


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Top-level statements, with those of top-level ``if`` and ``try`` blocks (``TYPE_CHECKING``, fallbacks)."""
    flat: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If | ast.Try):
            flat += _top_level(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])
        else:
            flat.append(node)
    return flat


def _targets(node: ast.AST) -> list[ast.expr]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, ast.AnnAssign) else []
    return [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def _absolute(dotted: str, node: ast.ImportFrom, root: Path) -> str:
    if not node.level:
        return node.module or ""
    package = dotted.split(".")
    is_package = root.joinpath(*package[1:], "__init__.py").is_file()
    base = package[: len(package) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _call_mismatch(need: str, signature: ast.arguments, wanted: list[str], is_method: bool) -> str | None:
    positional = signature.posonlyargs + signature.args
    params = [a.arg for a in positional[1 if is_method else 0:]]
    defaults = {a.arg for a in positional[len(positional) - len(signature.defaults):]}
    params += [a.arg for a in signature.kwonlyargs]
    defaults |= {a.arg for a, d in zip(signature.kwonlyargs, signature.kw_defaults, strict=True) if d is not None}
    unknown = [w for w in wanted if w not in params and signature.kwarg is None]
    required = [p for p in params if p not in defaults and p not in wanted]
    if unknown or required:
        return f"{need}: the signature is ({', '.join(params)}): unknown {unknown}, required not given {required}"
    return None


def plugin_imports() -> list[str]:
    """``module:Name`` for every ``from vllm... import Name`` in the plugin's modules (``module`` for ``import``)."""
    found = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                found += [f"{node.module}:{alias.name}" for alias in node.names]
    return sorted(set(found))


def check(root: Path) -> list[str]:
    """Every unmet need of the plugin in the vLLM package directory ``root``."""
    tree = Tree(root)
    return [why for need in (*plugin_imports(), *NEEDS) if (why := tree.missing(need))]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "__init__.py").is_file():
        print("usage: python -m skiptrain.serving.vllm_names VLLM_PACKAGE_DIR (the directory of vllm/__init__.py)",
              file=sys.stderr)
        return 2
    root = Path(args[0])
    unmet = check(root)
    total = len(plugin_imports()) + len(NEEDS)
    version = Tree(root).version()
    for why in unmet:
        print(f"missing: {why}")
    print(f"vLLM {version} at {root}: {total - len(unmet)} of the {total} names the plugin uses are present")
    return 1 if unmet else 0


if __name__ == "__main__":
    raise SystemExit(main())
