"""QLoRA against LoRA on this CPU: step time and memory of the SmolLM2 E2E study setup (flat 2x, LoRA r=64 on every
linear layer, batch 8), with the base in float32, under bf16 autocast, and in 4-bit NF4 (float32 or bfloat16 compute).

    python -m benchmarks.machine.qlora --steps 8 --out benchmarks/results/qlora/cpu_step_memory.json

Each configuration runs in its own process pinned to one core (``--core``, one thread), so peak memory is its own.
Reported per configuration: the median wall and CPU (user + system) time of the training steps after the first (on
a shared machine the CPU time is the steadier of the two), the base model's weight bytes
(parameters and buffers of the model without adapters), the peak resident memory sampled while training (before
backward, before the optimizer step, after the step), and the process's peak resident memory over everything
(loading included: the bundled model is a GGUF file, de-quantized to float32 before it is quantized again).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.common.machine import cpu_model

CONFIGS = {
    "lora_fp32": ("32-true", None),
    "lora_bf16_mixed": ("bf16-mixed", None),
    "qlora_nf4_fp32_compute": ("32-true", "float32"),
    "qlora_nf4_bf16_compute": ("bf16-mixed", "bfloat16"),
}
BASE = ["benchmarks/quality/e2e/train_base.yaml", "benchmarks/quality/schedules/flat2x.yaml",
        "benchmarks/quality/levers/lora_all_r64.yaml"]


def rss_bytes() -> int:
    """Resident memory of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Probe(Callback):
    """Step times and the peak resident memory seen while training."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self.peak = 0
        self._started = self._cpu_started = 0.0

    def _sample(self) -> None:
        self.peak = max(self.peak, rss_bytes())

    def on_train_batch_start(self, *args) -> None:
        self._started, self._cpu_started = time.perf_counter(), time.process_time()

    def on_before_backward(self, *args) -> None:
        self._sample()

    def on_before_optimizer_step(self, *args) -> None:
        self._sample()

    def on_train_batch_end(self, *args) -> None:
        self._sample()
        self.times.append(time.perf_counter() - self._started)
        self.cpu_times.append(time.process_time() - self._cpu_started)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the base model's parameters and buffers (LoRA adapters left out)."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return sum(t.numel() * t.element_size() for name, t in tensors if "lora_" not in name)


def run_one(name: str, steps: int, root: str) -> dict:
    from skiptrain.cli.app import main

    precision, compute = CONFIGS[name]
    args = [*(a for path in BASE for a in ("--config", path)), "--trainer.precision", precision,
            "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0", "--trainer.logger", "false",
            "--trainer.default_root_dir", f"{root}/{name}"]
    if compute is not None:
        args += ["--model.quantization", f"{{bits: 4, type: nf4, double_quant: true, compute_dtype: {compute}}}"]
    cli = main(args, run=False)
    probe = Probe()
    cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return {
        "precision": precision,
        "quantization": None if compute is None else {"bits": 4, "type": "nf4", "double_quant": True,
                                                       "compute_dtype": compute},
        "steps": steps,
        "step_seconds_median": statistics.median(probe.times[1:]),
        "step_cpu_seconds_median": statistics.median(probe.cpu_times[1:]),
        "step_seconds": [round(t, 3) for t in probe.times],
        "step_cpu_seconds": [round(t, 3) for t in probe.cpu_times],
        "base_weight_bytes": weight_bytes(cli.model.model),
        "peak_rss_training_bytes": probe.peak,
        "peak_rss_process_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--one", choices=list(CONFIGS), help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--root", default="runs/bench_qlora")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args.steps, args.root)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    report = {
        "command": f"python -m benchmarks.machine.qlora --steps {args.steps} --core {args.core}",
        "machine": f"{cpu_model()}, 1 pinned core of a 2-core machine shared with other jobs, 1 thread",
        "torch": torch.__version__, "bitsandbytes": version("bitsandbytes"),
        "setup": "SmolLM2-135M-Instruct, E2E study base (batch 8, 96+64 tokens), flat 2x, LoRA r=64 on every "
                 "linear layer",
        "results": {},
    }
    for name in args.configs:
        child = subprocess.run(["taskset", "-c", str(args.core), sys.executable, "-m", __spec__.name, "--one", name,
                                "--steps", str(args.steps), "--root", args.root],
                               env=env, capture_output=True, text=True)
        if child.returncode != 0:
            raise SystemExit(f"{name} failed (exit {child.returncode}): {child.stderr[-2000:]}")
        result = report["results"][name] = json.loads(child.stdout.rsplit("RESULT ", 1)[1])
        print(name, json.dumps({k: v for k, v in result.items() if k != "step_seconds"}), flush=True)
        if args.out:  # after every configuration, so a run stopped early keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n")

if __name__ == "__main__":
    main()
