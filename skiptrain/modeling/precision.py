"""Precision the device runs natively: ``trainer.precision: auto``, the warning for an emulated one, and the dtype
weights load in.

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

from dataclasses import dataclass
from typing import Literal

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

AUTO = "auto"
BF16_SLOWDOWN = "bf16 matrix products run tens of times slower than fp32 there"
"""What an emulated bf16 costs: a 1024x1024 product on one thread runs 48x (an AVX2 EPYC) to 112x (AVX2 kernels only
on a Xeon) slower in bf16 than in fp32 (benchmarks/RESULTS.md, "Precision on CPUs")."""
ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
"""Lightning's short precision names and what they stand for."""

WeightsDtype = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PrecisionWarning(UserWarning):
    """An explicit precision that the device can only emulate."""


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


def cpu_bf16_feature() -> str | None:
    """The capability probe: the CPU feature that runs bf16 natively (``AMX`` or ``AVX512-BF16``), or ``None``.

    ATen must dispatch its AVX512 kernels too (``ATEN_CPU_CAPABILITY=avx2`` lowers them, and bf16 is emulated).
    """
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
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


def resolve_precision(precision: object, accelerator: object = "auto") -> object:
    """The precision to give Lightning for ``precision``: ``auto`` resolved by the table above, said in one line.

    Any other value is returned as given, with a :class:`PrecisionWarning` when the device only emulates it.
    """
    text = str(precision)
    if text == AUTO:
        device = probe_device(accelerator)
        chosen = "bf16-mixed" if device.native_bf16 else "16-mixed" if device.cuda else "32-true"
        rank_zero_info(f"skiptrain: precision auto -> {chosen}: {device.name}, {device.why}")
        return chosen
    if text.startswith("bf16"):
        device = probe_device(accelerator)
        if not device.native_bf16:
            rank_zero_warn(f"precision={text} on {device.name}, which has {device.why}: {BF16_SLOWDOWN}; use "
                           "--trainer.precision auto (or 32-true) to train at this device's speed",
                           category=PrecisionWarning)
    return precision


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


__all__ = ["Device", "PrecisionWarning", "compute_dtype", "cpu_bf16_feature", "probe_device", "resolve_precision",
           "weights_dtype"]
