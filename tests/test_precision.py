"""``trainer.precision: auto``, the warning for a precision the device only emulates, the dtype weights load in, and
what a run says before its progress bar."""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch
from helpers.cli_args import tiny_args

import skiptrain.modeling.precision as precision
from skiptrain.cli.app import main
from skiptrain.cli.trainer import SkipTrainer
from skiptrain.modeling.precision import cpu_bf16_feature, weights_dtype
from skiptrain.training.precision import PrecisionWarning, resolve_precision


@pytest.fixture
def device(monkeypatch):
    """``device(cuda=..., cuda_bf16=..., cpu_feature=...)``: the capability probe and ``torch.cuda`` replaced."""

    def replace(cuda: bool = False, cuda_bf16: bool = False, cpu_feature: str | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: cuda_bf16)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4" if not cuda_bf16 else "A100")
        monkeypatch.setattr(precision, "cpu_bf16_feature", lambda: cpu_feature)

    return replace


@pytest.mark.parametrize(("cuda", "cuda_bf16", "cpu_feature", "accelerator", "expected"), [
    (True, True, None, "auto", "bf16-mixed"),  # CUDA with bf16 (Ampere and newer)
    (True, True, None, "gpu", "bf16-mixed"),
    (True, False, None, "auto", "16-mixed"),  # CUDA without bf16 (V100, T4)
    (True, False, None, "cuda", "16-mixed"),
    (False, False, "AVX512-BF16", "auto", "bf16-mixed"),  # CPU with native bf16
    (False, False, "AMX", "cpu", "bf16-mixed"),
    (True, True, "AMX", "cpu", "bf16-mixed"),  # the CPU is asked for, not the GPU beside it
    (True, True, None, "cpu", "32-true"),
    (False, False, None, "auto", "32-true"),  # any other CPU
    (False, False, None, "cpu", "32-true"),
])
def test_auto_resolves_by_the_device_table(device, cuda, cuda_bf16, cpu_feature, accelerator, expected,
                                          caplog):
    device(cuda, cuda_bf16, cpu_feature)
    caplog.set_level(logging.INFO, logger="skiptrain")
    assert resolve_precision("auto", accelerator) == expected
    (line,) = [r.getMessage() for r in caplog.records if "precision auto" in r.getMessage()]
    assert line.startswith(f"skiptrain: precision auto -> {expected}: ")
    assert ("CUDA device" in line) == (accelerator != "cpu" and cuda)


@pytest.mark.parametrize(("onednn_isa", "amx", "avx512_bf16", "expected"), [
    (None, True, True, "AMX"),
    (None, False, True, "AVX512-BF16"),
    (None, False, False, None),
    ("AVX512_CORE_BF16", False, True, "AVX512-BF16"),
    ("avx2", True, True, None),  # oneDNN capped below its bf16 kernels: emulated
])
def test_the_cpu_probe_needs_a_bf16_unit_that_onednn_may_use(monkeypatch, onednn_isa, amx, avx512_bf16, expected):
    if onednn_isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", onednn_isa)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert cpu_bf16_feature() == expected


def probe_and_slowdown() -> tuple[str | None, float]:
    """The probe's answer, and a 256x256 product's best time in bf16 over fp32, on one thread."""
    import time

    import torch

    from skiptrain.modeling.precision import cpu_bf16_feature

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(256, 256).to(dtype), torch.randn(256, 256).to(dtype)
            a @ b
            best = float("inf")
            for _ in range(5):
                started = time.perf_counter()
                a @ b
                best = min(best, time.perf_counter() - started)
            seconds[dtype] = best
        return cpu_bf16_feature(), seconds[torch.bfloat16] / seconds[torch.float32]
    finally:
        torch.set_num_threads(threads)


def agree(feature: str | None, slowdown: float) -> None:
    """Native bf16 runs the product about as fast as fp32 (0.4-0.8x measured on AVX512-BF16); emulated, tens of
    times slower (17-80x)."""
    if feature is not None:
        assert slowdown < 4, f"the probe says {feature}, but bf16 runs {slowdown:.1f}x slower than fp32"
    else:
        assert slowdown > 8, f"the probe says bf16 is emulated, but it runs {slowdown:.1f}x the time of fp32"


def test_the_real_probe_agrees_with_a_measured_bf16_matmul_on_this_host():
    agree(*probe_and_slowdown())


def test_the_real_probe_agrees_where_onednn_is_capped_below_bf16():
    """Capping oneDNN at AVX2 makes any host emulate bf16: the other answer, checked on every host."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    code = inspect.getsource(probe_and_slowdown) + "\nimport json\nprint(json.dumps(probe_and_slowdown()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**env, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert done.returncode == 0, done.stderr
    feature, slowdown = json.loads(done.stdout)
    assert feature is None
    agree(feature, slowdown)


def precision_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, PrecisionWarning)]


def test_explicit_bf16_without_native_support_warns_once_in_one_line(device):
    device(cpu_feature=None)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer = SkipTrainer(accelerator="cpu", precision="bf16-mixed", logger=False)
    assert trainer.precision == "bf16-mixed"  # a warning, not a refusal
    (message,) = precision_warnings(record)
    assert "\n" not in message and "CPU (" in message and "tens of times slower" in message
    assert "--trainer.precision auto" in message and "32-true" in message


@pytest.mark.parametrize("given", ["bf16-mixed", "bf16-true", "32-true", "16-mixed"])
def test_no_warning_where_the_device_runs_the_precision(device, given):
    device(cpu_feature="AVX512-BF16")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        SkipTrainer(accelerator="cpu", precision=given, logger=False)
    assert precision_warnings(record) == []


@pytest.mark.parametrize(("given", "lora", "override", "expected"), [
    ("bf16-mixed", True, "auto", torch.bfloat16),  # frozen base weights: half the memory
    ("bf16-mixed", False, "auto", torch.float32),  # full fine-tuning keeps fp32 master weights
    ("bf16", True, "auto", torch.bfloat16),  # Lightning's alias of bf16-mixed
    ("bf16-true", False, "auto", torch.bfloat16),
    ("16-mixed", True, "auto", torch.float32),
    ("16-true", True, "auto", torch.float16),
    ("32-true", True, "auto", torch.float32),
    ("32-true", True, "bfloat16", torch.bfloat16),  # model.dtype overrides
    ("bf16-mixed", True, "float32", torch.float32),
])
def test_weights_load_in_the_dtype_the_precision_implies(given, lora, override, expected):
    assert weights_dtype(given, trains_all_weights=not lora, override=override) == expected


def test_a_recipe_with_precision_auto_trains_a_step_in_what_it_resolved_to(device, tiny_model_dir, tmp_path):
    device(cpu_feature="AVX512-BF16")
    cli = main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", "--data.task", "builtin",
                                   "--data.max_train_samples", "8", "--model.lora", "{r: 4, lora_alpha: 8}",
                                   "--model.generation.num_batches", "0", "--trainer.precision", "auto",
                                   "--trainer.fast_dev_run", "1")])
    assert cli.trainer.global_step == 1 and cli.trainer.precision == "bf16-mixed"
    assert cli.config["fit"]["trainer"]["precision"] == "auto"  # the run's config.yaml resolves again where reused
    base = cli.model.model.get_base_model()
    assert base.model.embed_tokens.weight.dtype == torch.bfloat16  # frozen under LoRA: loaded in bf16
    assert {p.dtype for p in cli.model.model.parameters() if p.requires_grad} == {torch.float32}  # adapters
    assert torch.isfinite(cli.trainer.logged_metrics["train/loss"])


def test_model_dtype_overrides_what_the_precision_implies(tiny_model_dir, tmp_path):
    cli = main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", "--data.task", "builtin",
                                   "--data.max_train_samples", "8", "--model.generation.num_batches", "0",
                                   "--model.dtype", "bfloat16", "--trainer.precision", "bf16-true",
                                   "--trainer.fast_dev_run", "1")])
    assert {p.dtype for p in cli.model.model.parameters()} == {torch.bfloat16}


def test_a_run_starts_with_its_own_facts_and_no_third_party_noise(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = tiny_args(tiny_model_dir("llama"), run_dir, "--data.task", "builtin", "--data.max_train_samples", "8",
                     "--model.lora", "{r: 4, lora_alpha: 8}", "--model.generation.num_batches", "0",
                     "--trainer.enable_model_summary", "true", "--trainer.precision", "32-true",
                     "--trainer.max_steps", "2", "--trainer.log_every_n_steps", "1",
                     "--trainer.limit_val_batches", "1", "--trainer.num_sanity_val_steps", "0")
    done = subprocess.run([sys.executable, "-m", "skiptrain", "fit", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    for fact in ("(LlamaForCausalLM, 4 layers, float32 weights), schedule skipdecode", "layers per generated token",
                 "ideal decode speedup", "trainable (", "skiptrain: precision 32-true on cpu",
                 f"skiptrain: logs in {run_dir}", "checkpoints in", "train/loss", "train/tokens_per_s"):
        assert fact in out, f"{fact!r} missing from:\n{out}"
    for noise in ("Total FLOPs", "LeafSpec", "is_gradient_checkpointing", "💡 Tip", "v_num"):
        assert noise not in out, f"{noise!r} in:\n{out}"
