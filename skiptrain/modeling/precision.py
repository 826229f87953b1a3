"""What the device computes natively (the probe behind ``trainer.precision: auto``, resolved in
:mod:`skiptrain.training.precision`), and the dtype weights load in.

On a CPU without native bf16 (no AVX512-BF16 or AMX, e.g. AVX2 only) a bf16 matrix product is emulated: tens of
times slower than fp32, so ``bf16-mixed`` there turns minutes into hours. ``auto`` picks what the device runs:

=========================================  =============
device                                     ``auto`` is
=========================================  =============
CUDA with bf16 (Ampere and newer)          ``bf16-mixed``
CUDA without bf16 (V100, T4)               ``16-mixed``
CPU with native bf16 (AVX512-BF16 or AMX)  ``bf16-mixed``
any other CPU                              ``32-true``
=========================================  =============
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch

AUTO = "auto"
ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
"""Lightning's short precision names and what they stand for."""

WeightsDtype = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Device:
    """The device a run trains on, and whether it computes in bf16 natively.

    Args:
        name: For the user, e.g. ``CUDA device NVIDIA A100`` or ``CPU (AVX2)``.
        cuda: Whether it is a CUDA device.
        native_bf16: Whether it runs bf16 matrix products natively.
        why: The feature that decides ``native_bf16``, e.g. ``AVX512-BF16`` or ``no AVX512-BF16 or AMX``.
    """

    name: str
    cuda: bool
    native_bf16: bool
    why: str


ONEDNN_ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"
BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10", "ALL")
"""oneDNN instruction-set caps (and their prefixes) that keep its bf16 kernels."""


def cpu_bf16_feature() -> str | None:
    """The capability probe: the CPU feature that runs bf16 natively (``AMX`` or ``AVX512-BF16``), or ``None``.

    oneDNN, which runs torch's CPU matrix products, must be allowed those instructions too: ``ONEDNN_MAX_CPU_ISA=AVX2``
    makes it emulate bf16, tens of times slower, whereas ATen's own dispatch (``ATEN_CPU_CAPABILITY``) leaves bf16
    matrix products as fast as fp32 (tests/test_precision.py measures both).
    """
    if not os.environ.get(ONEDNN_ISA_VARIABLE, "ALL").strip().upper().startswith(BF16_ISAS):
        return None
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    return "AVX512-BF16" if torch.cpu._is_avx512_bf16_supported() else None


def probe_device(accelerator: object = "auto") -> Device:
    """The device that ``accelerator`` (a Trainer's, e.g. ``auto``, ``cpu``, ``gpu``, ``cuda``) trains on."""
    name = str(accelerator).lower()
    if name in ("cuda", "gpu") or name == "auto" and torch.cuda.is_available():
        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "(none found)"
        return Device(f"CUDA device {device}", True, bf16, "bf16 supported" if bf16 else "no bf16 (before Ampere)")
    feature = cpu_bf16_feature()
    return Device(f"CPU ({torch.backends.cpu.get_cpu_capability()})", False, feature is not None,
                  feature or "no AVX512-BF16 or AMX")


def _unified(precision: object) -> str:
    """``precision`` (a resolved Lightning precision) by its full name, e.g. ``bf16-mixed`` for ``bf16``."""
    return ALIASES.get(str(precision), str(precision))


def compute_dtype(precision: object) -> torch.dtype:
    """The dtype that matrix products run in under a resolved Lightning ``precision``."""
    text = _unified(precision)
    if text.startswith("bf16"):
        return torch.bfloat16
    if text.startswith("16-"):
        return torch.float16
    return torch.float64 if text == "64-true" else torch.float32


def weights_dtype(precision: object, trains_all_weights: bool, override: WeightsDtype = "auto") -> torch.dtype:
    """The dtype to load a model's weights in (``model.dtype``; ``auto`` derives it from ``precision``).

    ``*-true`` precisions compute in their dtype, so weights load in it. Under ``bf16-mixed`` frozen weights (LoRA)
    load in bf16, half the memory of fp32, while full fine-tuning keeps fp32 master weights for the optimizer.
    Anything else loads in fp32.
    """
    if override != AUTO:
        return DTYPES[override]
    text = _unified(precision)
    if text.endswith("-true"):
        return compute_dtype(text)
    if text == "bf16-mixed" and not trains_all_weights:
        return torch.bfloat16
    return torch.float32


__all__ = ["Device", "compute_dtype", "cpu_bf16_feature", "probe_device", "weights_dtype"]
