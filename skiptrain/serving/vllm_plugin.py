"""The vLLM general plugin: registers the skip-aware model classes under their own architecture names.

vLLM calls :func:`register` in every process it starts (``vllm.general_plugins`` entry point). An export is served
under its schedule by selecting the skip-aware class of its family with ``hf_overrides``, e.g.
``LLM(model=export, hf_overrides={"architectures": ["SkipLlamaForCausalLM"]})``; without it vLLM serves the export
densely, as any Hugging Face model directory.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

SUPPORTED_VLLM = ">=0.32.0,<0.34"
"""The vLLM releases the plugin supports; :func:`register` warns outside them (docs/serving.md, "vLLM versions").
0.32 is engine-tested (its CPU build, the newest vLLM has); 0.33 has GPU builds only and passes the static check of
every vLLM name the plugin uses (:mod:`skiptrain.serving.vllm_names`); 0.34 fails it (no V1 model runner)."""

ARCHITECTURES = {
    "LlamaForCausalLM": "SkipLlamaForCausalLM",
    "MistralForCausalLM": "SkipMistralForCausalLM",
    "Qwen2ForCausalLM": "SkipQwen2ForCausalLM",
    "Qwen3ForCausalLM": "SkipQwen3ForCausalLM",
    "Phi3ForCausalLM": "SkipPhi3ForCausalLM",
    "Gemma2ForCausalLM": "SkipGemma2ForCausalLM",
    "Gemma3ForCausalLM": "SkipGemma3ForCausalLM",  # Gemma 3 text (model_type gemma3_text)
    "OPTForCausalLM": "SkipOPTForCausalLM",
    "GPT2LMHeadModel": "SkipGPT2LMHeadModel",
}
"""A model's transformers architecture -> the skip-aware class that serves it under its schedule."""

MODELS_MODULE = "skiptrain.serving.vllm_models"


def register() -> None:
    """Register every skip-aware class with vLLM's model registry (lazily: the module loads when a model needs it)."""
    import vllm
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
    from vllm import ModelRegistry

    installed = Version(vllm.__version__.split("+")[0])
    if installed not in SpecifierSet(SUPPORTED_VLLM):
        logging.getLogger(__name__).warning(
            "skiptrain's vLLM plugin is tested with vllm%s, not %s: check that exports still decode exactly "
            "(docs/serving.md, tests/test_vllm.py) before serving", SUPPORTED_VLLM, installed)
    # vLLM's V2 model runner (the default on GPUs from 0.32) loads V2-interface logits processors only and refuses the
    # plugin's V1 one, which hands the model its prompt lengths, for every model served; the V1 runner serves them all.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    for name in ARCHITECTURES.values():
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, f"{MODELS_MODULE}:{name}")


def hf_overrides(export: str | os.PathLike) -> dict[str, list[str]]:
    """The ``hf_overrides`` that serve ``export`` (a model directory) under its schedule: its skip-aware class.

    Raises:
        ValueError: naming the architectures when no skip-aware class serves them.
    """
    architectures = json.loads((Path(export) / "config.json").read_text()).get("architectures") or []
    for architecture in architectures:
        if architecture in ARCHITECTURES:
            return {"architectures": [ARCHITECTURES[architecture]]}
    raise ValueError(f"config.json architectures={architectures} has no skip-aware vLLM class: allowed "
                     f"{sorted(ARCHITECTURES)}")
