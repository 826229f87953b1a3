"""QLoRA: LoRA adapters trained on a base model whose linear layers are stored in 4 (or 8) bits by bitsandbytes.

The base loads through transformers' ``BitsAndBytesConfig`` and is prepared by peft's
``prepare_model_for_kbit_training``; the adapters are then added as for any LoRA run, and the skip-aware forward runs
on the quantized layers unchanged. Merging an adapter into 4-bit weights would round the sum back to 4 bits, so a
merged export dequantizes the base first (:func:`merge_into_dequantized`): the exported weights are the quantized
base the adapters were trained on, plus the adapters, in the export dtype.

bitsandbytes is an optional extra: ``pip install 'skiptrain[qlora]'``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from peft import PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict
from transformers import BitsAndBytesConfig, PreTrainedModel

from skiptrain.errors import UsageError
from skiptrain.modeling.precision import compute_dtype as precision_compute_dtype

COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
INSTALL_HINT = "pip install 'skiptrain[qlora]'"


@dataclass
class Quantization:
    """Base weights stored by bitsandbytes; only LoRA adapters train on top of them (QLoRA).

    Args:
        bits: 4 (NF4/FP4 blocks, the QLoRA setting) or 8 (LLM.int8()).
        type: The 4-bit data type: ``nf4`` (normal float, the QLoRA paper's) or ``fp4``.
        double_quant: Quantize the 4-bit blocks' scales too (about 0.4 bits per weight saved).
        compute_dtype: Dtype the 4-bit layers compute in: ``auto`` follows the trainer's precision (bfloat16 for
            ``bf16-*``, float16 for ``16-*``, else float32), or ``float32``, ``bfloat16``, ``float16``.
    """

    bits: Literal[4, 8] = 4
    type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise UsageError(f"quantization.bits={self.bits!r} is invalid: allowed 4 or 8")
        if self.type not in ("nf4", "fp4"):
            raise UsageError(f"quantization.type={self.type!r} is invalid: allowed 'nf4' or 'fp4'")
        if self.compute_dtype != "auto" and self.compute_dtype not in COMPUTE_DTYPES:
            raise UsageError(f"quantization.compute_dtype={self.compute_dtype!r} is invalid: allowed 'auto', "
                             + ", ".join(repr(name) for name in COMPUTE_DTYPES))

    @classmethod
    def from_hparams(cls, stored: Quantization | Mapping[str, Any] | None) -> Quantization | None:
        """The settings as a checkpoint stores them: the object itself, or its fields (a LightningCLI config)."""
        if stored is None or isinstance(stored, Quantization):
            return stored
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dict(stored).items() if k in names})

    def config(self, precision: str | None = None) -> BitsAndBytesConfig:
        """The transformers config that quantizes the base at load time, for a trainer of ``precision``.

        Raises:
            UsageError: when bitsandbytes is not installed.
        """
        require_bitsandbytes()
        if self.bits == 8:
            return BitsAndBytesConfig(load_in_8bit=True)
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=self.type, bnb_4bit_use_double_quant=self.double_quant,
            bnb_4bit_compute_dtype=self.resolved_compute_dtype(precision),
        )

    def resolved_compute_dtype(self, precision: str | None) -> torch.dtype:
        """``compute_dtype``, with ``auto`` resolved from a Lightning precision as matrix products run in it
        (:func:`~skiptrain.modeling.precision.compute_dtype`; ``None``: float32)."""
        if self.compute_dtype != "auto":
            return COMPUTE_DTYPES[self.compute_dtype]
        return precision_compute_dtype(precision or "32-true")

    def describe(self) -> str:
        """A short name, e.g. ``4-bit nf4 (double quantization)``."""
        if self.bits == 8:
            return "8-bit LLM.int8()"
        return f"4-bit {self.type}" + (" (double quantization)" if self.double_quant else "")


def require_bitsandbytes() -> None:
    """Raise :class:`UsageError` (one line, with the install command) when bitsandbytes is not installed."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise UsageError(f"model.quantization needs bitsandbytes, which is not installed: {INSTALL_HINT}") from None


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether ``model`` (peft-wrapped or not) has base weights quantized by bitsandbytes."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    return bool(getattr(base, "is_quantized", False)) and getattr(base, "hf_quantizer", None) is not None


def merge_into_dequantized(model: PeftModel, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A copy of a QLoRA model as a plain transformers model: the base dequantized, then the adapters merged.

    Merging straight into the 4-bit weights would quantize the merged sum again and change the model; here the
    result computes what the trained model computes, in ``dtype`` (default: float32).
    """
    adapter = get_peft_model_state_dict(model)
    peft_config = copy.deepcopy(model.peft_config[model.active_adapter])
    peft_config.inference_mode = True
    base = copy.deepcopy(model).unload()  # the quantized base without adapter layers; ``model`` is untouched
    base = base.dequantize(dtype=dtype or torch.float32).to(dtype or torch.float32)
    adapted = get_peft_model(base, peft_config)
    set_peft_model_state_dict(adapted, adapter)
    return adapted.merge_and_unload()



def quantized_weight_names(module: torch.nn.Module) -> tuple[str, ...]:
    """State-dict names of the bitsandbytes-quantized weights under ``module`` (each with its quantization state
    stored under ``<name>.*``): frozen, and made again from the base model at load, so checkpoints leave them out."""
    import bitsandbytes as bnb

    layers = (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    return tuple(f"{name}.weight" for name, layer in module.named_modules() if isinstance(layer, layers))


def is_under(key: str, names: tuple[str, ...]) -> bool:
    """Whether state-dict ``key`` is one of ``names`` or stored under one of them (``name.*``)."""
    return any(key == name or key.startswith(name + ".") for name in names)


def use_training_kernels(model: torch.nn.Module) -> None:
    """Make every 4-bit layer of ``model`` compute as it does in training, also without gradients.

    On CPUs with AVX512-BF16, bitsandbytes switches a layer run in eval mode without gradients to a fused kernel over
    weights repacked in place; its results differ from the training path's, and saving the layer re-quantizes the
    repacked block scales. Keeping the training path makes validation and skip-aware decoding compute exactly what
    training computed, and leaves the quantized weights untouched.
    """
    import bitsandbytes as bnb

    for layer in model.modules():
        if isinstance(layer, bnb.nn.Linear4bit):
            layer.support_avx512bf16_for_cpu = False
