"""How fast a CPU multiplies matrices in fp32 and bf16, natively and with AVX2 kernels only (bf16 then emulated).

Each case runs in its own process: as the machine is, and with ``--emulate_avx2`` dispatch (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``), which is what a CPU without AVX512-BF16 or AMX runs.

    python -m benchmarks.machine.precision --out benchmarks/results/precision_cpu_matmul.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common.machine import cpu_model
from benchmarks.speed.quickstart import AVX2_ONLY

SIZE, SECONDS = 1024, 3.0


def measure() -> dict:
    """GFLOP/s of a SIZE x SIZE matrix product on one thread, per dtype, in this process."""
    import torch

    from skiptrain.modeling.precision import cpu_bf16_feature

    torch.set_num_threads(1)
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        started, count = time.perf_counter(), 0
        while time.perf_counter() - started < SECONDS:
            x @ y
            count += 1
        rates[str(dtype).removeprefix("torch.")] = round(2 * SIZE**3 * count / (time.perf_counter() - started) / 1e9, 2)
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": cpu_bf16_feature(),
            "gflops": rates, "bf16_slowdown": round(rates["float32"] / rates["bfloat16"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--case", action="store_true", help="measure in this process and print JSON")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(measure()))
        return
    cases = {}
    for name, env in (("native", {}), ("avx2_only", AVX2_ONLY)):
        done = subprocess.run([sys.executable, "-m", __spec__.name, "--case"], env={**os.environ, **env},
                              capture_output=True, text=True, check=True)
        cases[name] = json.loads(done.stdout)
    record = {"command": "python -m benchmarks.machine.precision " + " ".join(sys.argv[1:]), "cpu": cpu_model(),
              "matrix": [SIZE, SIZE], "threads": 1, "load_average": list(os.getloadavg()), "cases": cases}
    print(json.dumps(record, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
