"""Faults that lose nothing: a fit killed or preempted resumes from its checkpoint, a checkpoint write cut short keeps
the previous one, an export killed midway or racing another leaves a whole export or none. Signals are real: the
runs that receive them are separate processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fsspec.implementations.local import LocalFileOpener
from helpers.cli_args import read_metrics, tiny_args
from helpers.interrupt import DiskFull

from skiptrain.cli.app import main
from skiptrain.core.output_dir import OutputDirError
from skiptrain.core.schedules import SkipDecode
from skiptrain.export.record import ExportRecord
from skiptrain.export.verify import verify_export
from skiptrain.export.write import write_export
from skiptrain.modeling.loading import load_causal_lm, load_tokenizer
from skiptrain.training.checkpoints import checkpoint_metadata

TESTS = Path(__file__).parent
CHECKPOINT_EVERY_EPOCH = ('{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", '
                          '"init_args": {"save_last": true}}')


def fit_args(model_dir: str, run_dir: Path, *extra: str) -> list[str]:
    """Two epochs of two LoRA steps, a checkpoint and ``last.ckpt`` after each epoch, the loss logged every step."""
    return ["fit", *tiny_args(
        model_dir, run_dir, "--data.task", "builtin", "--data.max_train_samples", "8",
        "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}", "--model.generation.num_batches", "0",
        "--trainer.log_every_n_steps", "1", "--seed_everything", "3", "--trainer.max_epochs", "2",
        "--trainer.limit_val_batches", "1", f"--trainer.callbacks+={CHECKPOINT_EVERY_EPOCH}", *extra,
    )]


def signal_at(step: int, name: str) -> str:
    return f'--trainer.callbacks+={{"class_path": "helpers.interrupt.SignalAtStep", "init_args": {{"step": {step}, ' \
           f'"signal": "{name}"}}}}'


def run_in_a_process(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    return subprocess.run([sys.executable, "-m", "skiptrain", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def losses(run_dir: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["train/loss"]) for r in read_metrics(run_dir) if r.get("train/loss")}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory) -> dict[int, float]:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    main(fit_args(tiny_model_dir("llama"), run_dir))
    return losses(run_dir)


def last_checkpoint(run_dir: Path) -> Path:
    (path,) = run_dir.rglob("last.ckpt")
    return path


def test_a_fit_killed_between_checkpoints_resumes_to_the_same_losses(uninterrupted, tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("llama")
    killed = run_in_a_process(fit_args(model_dir, tmp_path / "killed", signal_at(3, "SIGKILL")))
    assert killed.returncode == -9, killed.stderr  # SIGKILL: no handler ran, nothing was cleaned up
    checkpoint = last_checkpoint(tmp_path / "killed")
    assert checkpoint_metadata(checkpoint)["global_step"] == 2  # the end of epoch 0; step 3 was lost with the process
    main(fit_args(model_dir, tmp_path / "resumed", "--ckpt_path", str(checkpoint)))
    resumed = losses(tmp_path / "resumed")
    assert len(uninterrupted) == 4 and set(resumed) == {2, 3}
    for step, value in resumed.items():
        assert value == pytest.approx(uninterrupted[step], abs=1e-6), f"step {step}"


def test_sigterm_saves_a_resumable_checkpoint_before_exit(tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("llama")
    preempted = run_in_a_process(fit_args(model_dir, tmp_path / "preempted", signal_at(2, "SIGTERM")))
    # Lightning stopped the run (the signal did not kill it), and the status says it did not finish: 128 + SIGTERM
    assert preempted.returncode == 143, preempted.stderr
    assert "SIGTERM at step 3: saved" in preempted.stderr, preempted.stderr
    checkpoint = last_checkpoint(tmp_path / "preempted")
    assert checkpoint_metadata(checkpoint)["global_step"] == 3  # mid-epoch 1: one step past the epoch checkpoint
    resumed = main(fit_args(model_dir, tmp_path / "resumed", "--ckpt_path", str(checkpoint)))
    assert resumed.trainer.global_step == 4 and set(losses(tmp_path / "resumed")) == {3}


def test_a_fit_preempted_mid_epoch_resumes_with_the_batches_it_had_not_seen(uninterrupted, tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir("llama")
    preempted = run_in_a_process(fit_args(model_dir, tmp_path / "preempted", signal_at(2, "SIGTERM")))
    assert preempted.returncode == 143, preempted.stderr
    checkpoint = last_checkpoint(tmp_path / "preempted")  # step 3: epoch 1's first batch done, its second not
    resumed = run_in_a_process(fit_args(model_dir, tmp_path / "resumed", "--ckpt_path", str(checkpoint)))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming epoch 1 at batch 2, after the 1 the stopped run trained" in resumed.stderr, resumed.stderr
    assert "dataloader is not resumable" not in resumed.stderr  # Lightning's warning: the position was restored
    # Step 3 trains on epoch 1's second batch, as the uninterrupted run did, not on a batch seen before the stop.
    assert losses(tmp_path / "resumed")[3] == pytest.approx(uninterrupted[3], abs=1e-6)


def test_a_checkpoint_write_cut_short_keeps_the_previous_last_ckpt(tiny_model_dir, tmp_path):
    failing = ('--trainer.callbacks+={"class_path": "helpers.interrupt.FailLastCheckpointWrite", '
               '"init_args": {"epoch": 1}}')
    write = LocalFileOpener.write
    with pytest.raises(DiskFull):
        main(fit_args(tiny_model_dir("llama"), tmp_path / "run", failing))
    assert LocalFileOpener.write is write  # the simulated fault is gone for the tests that follow
    checkpoint = last_checkpoint(tmp_path / "run")
    assert checkpoint_metadata(checkpoint)["global_step"] == 2  # epoch 0's, whole
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    assert state and all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    left = {p.name for p in checkpoint.parent.iterdir()}
    assert "last.ckpt" in left and left <= {"last.ckpt", "epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"}, left


@pytest.fixture
def plain_model(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    return load_causal_lm(model_dir), load_tokenizer(model_dir), SkipDecode(min_layers=2).build(4), model_dir


def test_an_export_killed_midway_leaves_no_target_and_the_next_export_clears_its_staging(plain_model, tmp_path):
    _, _, _, model_dir = plain_model
    target = tmp_path / "out"
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from skiptrain.export.write import write_export
        from skiptrain.modeling.loading import load_causal_lm, load_tokenizer
        from skiptrain.export.record import ExportRecord
        from skiptrain.core.schedules import SkipDecode
        tokenizer = load_tokenizer({model_dir!r})
        type(tokenizer).save_pretrained = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # after the weights
        write_export(load_causal_lm({model_dir!r}), tokenizer, SkipDecode(min_layers=2).build(4), {str(target)!r},
                     ExportRecord({model_dir!r}))
    """)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(TESTS.parent)}, timeout=300)
    assert killed.returncode == -9, killed.stderr
    (staging,) = tmp_path.iterdir()  # the killed export's half-written staging directory, and no target
    assert staging.name.startswith(".out.tmp-") and (staging / "model.safetensors").is_file()
    model, tokenizer, schedule, _ = plain_model
    write_export(model, tokenizer, schedule, target, ExportRecord(model_dir))
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    verify_export(target)


def test_two_exports_racing_for_one_target_one_wins_one_refuses(plain_model, tmp_path, monkeypatch):
    model, tokenizer, schedule, model_dir = plain_model
    target = tmp_path / "out"
    winner = SkipDecode(min_layers=3).build(4)
    save = type(tokenizer).save_pretrained

    def the_other_export_finishes_first(self, *args, **kwargs):
        monkeypatch.setattr(type(tokenizer), "save_pretrained", save)
        write_export(model, tokenizer, winner, target, ExportRecord(model_dir))  # passes check_output_dir and lands
        return save(self, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "save_pretrained", the_other_export_finishes_first)
    with pytest.raises(OutputDirError, match="was written by another process while this one was writing it"):
        write_export(model, tokenizer, schedule, target, ExportRecord(model_dir))
    assert verify_export(target).schedule == winner  # the winner's export, whole and alone
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
