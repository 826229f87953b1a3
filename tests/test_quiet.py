"""A quiet CLI: no command, ``--help`` included, prints the third-party notices :mod:`skiptrain.cli.quiet` drops.

Each command runs as a user runs it, in a fresh interpreter (``python -m skiptrain``), since the notices are printed
while bitsandbytes, DeepSpeed and Lightning are first imported or first build a trainer.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from skiptrain.cli.quiet import DROPPED_LOG_LINES, DROPPED_WARNINGS, silence_third_party_noise

ROOT = Path(__file__).resolve().parents[1]
NOTICES = (
    "gemm_4bit_forward",  # bitsandbytes, as it is imported
    "pip install kernels",
    "tensorboardX",  # Lightning, building a trainer without a logger
    "async_io",  # DeepSpeed, as it is imported
    "libaio",
    "💡 Tip",
    "No seed found",  # Lightning, repeated by its "Seed set to 0"
)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": ""}
    return subprocess.run([sys.executable, "-m", "skiptrain", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)


def assert_quiet(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr
    assert not [notice for notice in NOTICES if notice in printed], printed[-3000:]


@pytest.mark.parametrize("args", [("--help",), ("fit", "--help")])
def test_help_prints_no_third_party_notice(args):
    result = run_cli(*args)
    assert_quiet(result)
    assert "usage:" in result.stdout


def test_export_and_generate_print_no_third_party_notice(tiny_model_dir, tmp_path):
    out = tmp_path / "export"
    assert_quiet(run_cli("export", "--model.model", tiny_model_dir("llama"), "--model.schedule", "SkipDecode",
                         "--model.schedule.min_layers", "2", "--output_dir", str(out)))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\n")
    result = run_cli("generate", "--model.model", str(out), "--prompts", str(prompts), "--max_new_tokens", "3",
                     "--raw_prompts", "true")
    assert_quiet(result)
    assert '"completion"' in result.stdout


def test_only_the_listed_notices_are_dropped(caplog):
    """The filters match by text and origin: the same logger's other lines, and other warnings, still show."""
    silence_third_party_noise()
    silence_third_party_noise()  # idempotent: one filter per logger
    for name in DROPPED_LOG_LINES:
        assert len(logging.getLogger(name).filters) == 1
    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    notice = "Failed to load CPU gemm_4bit_forward from kernels-community: no kernels."
    with caplog.at_level(logging.WARNING, logger=bnb.name):
        for source, message in [("bitsandbytes/backends/cpu/ops.py", notice), ("bitsandbytes/backends/cpu/ops.py",
                                 "another bitsandbytes warning"), ("elsewhere.py", notice)]:  # as logged from there
            bnb.handle(bnb.makeRecord(bnb.name, logging.WARNING, source, 1, message, (), None))
    assert [(r.module, r.getMessage()) for r in caplog.records if r.name == bnb.name] == [
        ("ops", "another bitsandbytes warning"), ("elsewhere", notice)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        silence_third_party_noise()
        warnings.warn("an unrelated warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["an unrelated warning"]
    assert DROPPED_WARNINGS
