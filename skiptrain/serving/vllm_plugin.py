"""The vLLM general plugin: registers the skip-aware model classes under their own architecture names.

vLLM calls :func:`register` in every process it starts (``vllm.general_plugins`` entry point). An export is served
under its schedule by selecting the skip-aware class of its family with ``hf_overrides``, e.g.
``LLM(model=export, hf_overrides={"architectures": ["SkipLlamaForCausalLM"]})``; without it vLLM serves the export
densely, as any Hugging Face model directory.

:func:`register` also checks the engine's settings where vLLM makes its config (:class:`EngineCheck`), in the
process that starts the engine, so a refusal ends ``LLM(...)`` or the API server before any engine process starts,
and the server prints it as one line (:func:`one_line_refusals`); and it keys prefix-cached KV blocks by what decides
them under a schedule (:mod:`skiptrain.serving.vllm_prefix`), so prefix caching stays on, as vLLM's default.

vLLM internals this relies on, besides :mod:`skiptrain.serving.vllm_prefix`'s:
``vllm.model_executor.models.config.MODELS_CONFIG_MAP``, vLLM's table of per-architecture config checks
(``verify_and_update_config``), run when a ``VllmConfig`` is made.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skiptrain.shipped.schedule import SkipScheduleError

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
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from skiptrain.serving.vllm_prefix import install

    # vLLM's V2 model runner (the default on GPUs from 0.32) loads V2-interface logits processors only and refuses the
    # plugin's V1 one, which hands the model its prompt lengths, for every model served; the V1 runner serves them all.
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    for name in ARCHITECTURES.values():
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, f"{MODELS_MODULE}:{name}")
        MODELS_CONFIG_MAP.setdefault(name, EngineCheck)
    install(serves_under_schedule)
    one_line_refusals()


def serves_under_schedule(vllm_config: Any) -> bool:
    """Whether the engine of ``vllm_config`` runs one of the skip-aware classes."""
    return bool(set(vllm_config.model_config.architectures or ()) & set(ARCHITECTURES.values()))


class EngineCheck:
    """vLLM's config check for the skip-aware classes: refuses what they cannot decode under, when the config is made.

    That is in the process that starts the engine (``LLM(...)``, the API server), before any engine process starts;
    the model checks again when it is built (:func:`skiptrain.serving.vllm_models.check_engine`).
    """

    @staticmethod
    def verify_and_update_config(vllm_config: Any) -> None:
        # loaded by name, as vLLM loads the classes (MODELS_MODULE imports this module)
        importlib.import_module(MODELS_MODULE).check_engine(vllm_config)

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        return None


def one_line_refusals() -> None:
    """Make an uncaught refusal of the plugin end the process with its one line, not a traceback (once per process).

    The API server raises the refusal out of its startup uncaught (wrapped by vLLM's config: :func:`refusal_in`);
    other exceptions keep Python's report.
    """
    previous = sys.excepthook
    if getattr(previous, "skiptrain", False):
        return

    def excepthook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        refusal = refusal_in(error)
        if refusal is not None:
            print(f"skiptrain: error: {' '.join(str(refusal).split())}", file=sys.stderr)
        else:
            previous(kind, error, trace)

    excepthook.skiptrain = True  # type: ignore[attr-defined]
    sys.excepthook = excepthook


def refusal_in(error: BaseException | None) -> SkipScheduleError | None:
    """The plugin's refusal that ``error`` is or carries, else ``None``.

    vLLM's config is a pydantic dataclass: a refusal raised by its checks (:class:`EngineCheck`) reaches the caller
    wrapped in pydantic's ``ValidationError``, whose errors keep the original (``ctx["error"]``).
    """
    from pydantic import ValidationError

    from skiptrain.shipped.schedule import SkipScheduleError

    if error is None or isinstance(error, SkipScheduleError):
        return error
    if isinstance(error, ValidationError):
        for detail in error.errors(include_url=False):
            if isinstance(found := detail.get("ctx", {}).get("error"), SkipScheduleError):
                return found
    return refusal_in(error.__cause__)


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
