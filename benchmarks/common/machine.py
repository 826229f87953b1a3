"""The machine a benchmark ran on, as every result records it: what its numbers depend on."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    info = Path("/proc/cpuinfo")
    names = re.findall(r"model name\s*: (.*)", info.read_text()) if info.exists() else []
    return names[0].strip() if names else platform.processor() or platform.machine()


def describe() -> dict:
    """CPU model and cores, the kernels ATen dispatches, whether bf16 is native, torch's threads and version."""
    import torch

    from skiptrain.modeling.precision import cpu_bf16_feature

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_bf16_feature(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__}
