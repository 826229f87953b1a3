"""The export callback exports the checkpoint that ``ModelCheckpoint(monitor=...)`` chose (``which: best``) or the
last weights (``which: last``), and says which, at which step and with which score, in the record and model card."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.cli_args import tiny_args
from safetensors.torch import load_file

from skiptrain.cli.app import main
from skiptrain.export.format import SCHEDULE_FILE, read_record
from skiptrain.training.checkpoints import checkpoint_metadata, consolidate_checkpoint

# train/lr falls every step under a cosine schedule without warm-up: the best checkpoint by max lr is step 1's
BEST_BY_LR = ('{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"monitor": "train/lr", '
              '"mode": "max", "every_n_train_steps": 1, "save_top_k": 1, "dirpath": "%s"}}')
EXPORT = '{"class_path": "skiptrain.callbacks.export.ExportCallback", "init_args": {"output_dir": "%s", "which": "%s"}}'


def fit_and_export(tiny_model_dir, root, which: str):
    return main(["fit", *tiny_args(
        tiny_model_dir("llama"), root / "fit", "--data.task", "builtin", "--data.max_train_samples", "16",
        "--model.optimizer.learning_rate", "0.05", "--model.optimizer.warmup_steps", "0",
        "--model.generation.num_batches", "0",
        "--trainer.max_steps", "3", "--trainer.limit_val_batches", "0", "--seed_everything", "1",
        f"--trainer.callbacks+={BEST_BY_LR % (root / 'ckpt')}",
        f"--trainer.callbacks+={EXPORT % (root / 'export', which)}",
    )])


def exported_weights(directory) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


@pytest.mark.parametrize("which", ["best", "last"])
def test_export_callback_exports_the_chosen_weights_and_records_them(which, tiny_model_dir, tmp_path):
    cli = fit_and_export(tiny_model_dir, tmp_path, which)
    (best_path,) = (tmp_path / "ckpt").glob("*.ckpt")
    best_step = checkpoint_metadata(best_path)["global_step"]
    assert best_step == 1 and cli.trainer.global_step == 3, "the best checkpoint is not the last weights"
    saved = exported_weights(tmp_path / "export")
    reference = consolidate_checkpoint(best_path, prefix="model.") if which == "best" else {
        name.removeprefix("model."): tensor for name, tensor in cli.model.state_dict().items()}
    for name, tensor in saved.items():
        assert torch.equal(tensor, reference[name]), name
    record = read_record(tmp_path / "export")
    card = (tmp_path / "export" / "README.md").read_text()
    if which == "best":
        assert record.checkpoint.which == "best" and record.checkpoint.step == 1
        assert record.checkpoint.monitor == "train/lr" and record.checkpoint.score == pytest.approx(0.05 * 1, rel=0.1)
        assert "the best checkpoint by `train/lr`" in card and "at step 1" in card
        best = consolidate_checkpoint(best_path)
        assert any(not torch.equal(t, best[name]) for name, t in cli.model.state_dict().items()), \
            "the module keeps the weights fit ended with"
    else:
        assert record.checkpoint.which == "last" and record.checkpoint.step == 3
        assert "the last weights of the run, at step 3" in card
    assert json.loads((tmp_path / "export" / SCHEDULE_FILE).read_text())["checkpoint"]["step"] == record.checkpoint.step

