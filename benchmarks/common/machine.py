"""The machine a benchmark ran on, as every result records it: what its numbers depend on."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
               "amx_int8", "neon", "asimd", "sve")
"""The CPU flags that decide which kernels a matrix product runs (x86 vector and matrix units, Arm's)."""


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    info = Path("/proc/cpuinfo")
    names = re.findall(r"model name\s*: (.*)", info.read_text()) if info.exists() else []
    return names[0].strip() if names else platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """Those of :data:`SPEED_FLAGS` the CPU reports in /proc/cpuinfo (empty where there is none)."""
    info = Path("/proc/cpuinfo")
    found = re.search(r"^(?:flags|Features)\s*: (.*)$", info.read_text(), re.MULTILINE) if info.exists() else None
    present = set(found.group(1).split()) if found else set()
    return [flag for flag in SPEED_FLAGS if flag in present]


def affinity() -> list[int] | None:
    """The cores this process may run on (``None`` where the OS does not say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def describe() -> dict:
    """CPU model, flags and cores, the cores this process may use, the kernels ATen dispatches, whether bf16 is
    native, torch's threads (and ``OMP_NUM_THREADS``) and torch's version."""
    import torch

    from skiptrain.modeling.precision import cpu_bf16_feature

    return {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
            "affinity": affinity(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_bf16_feature(), "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__}
