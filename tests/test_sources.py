"""Weights sources: one resolver tells pretrained models, exports and checkpoints apart, and SkipLM refuses an
``init_from`` or teacher that is not an earlier run."""

from __future__ import annotations

import pytest
import torch
from helpers.cli_args import tiny_args

from skiptrain import Dense
from skiptrain.cli.app import main
from skiptrain.errors import UsageError
from skiptrain.training.module import Distillation, SkipLM
from skiptrain.training.settings import upgrade_hparams
from skiptrain.training.sources import load_trained_model, resolve_weights_source


def test_each_kind_of_source_is_told_apart(tiny_model_dir, skip_export, tmp_path):
    checkpoint = tmp_path / "run.ckpt"
    torch.save({"state_dict": {}}, checkpoint)
    deepspeed = tmp_path / "ds"
    (deepspeed / "global_step1").mkdir(parents=True)
    (deepspeed / "latest").write_text("global_step1")
    fsdp = tmp_path / "fsdp"
    fsdp.mkdir()
    (fsdp / ".metadata").write_bytes(b"")
    kinds = {
        "facebook/opt-125m": "pretrained",  # a hub id: nothing is looked up
        "smollm2-135m-instruct": "pretrained",
        str(tmp_path / "model.gguf"): "pretrained",
        tiny_model_dir("llama"): "pretrained",
        str(skip_export("llama")): "export",
        str(checkpoint): "checkpoint",
        str(deepspeed): "checkpoint",
        str(fsdp): "checkpoint",
    }
    assert {name: resolve_weights_source(name).kind for name in kinds} == kinds


def test_only_an_export_brings_a_schedule(tiny_model_dir, skip_export):
    exported = resolve_weights_source(skip_export("llama"))
    assert exported.schedule() == exported.load_export().schedule
    assert resolve_weights_source(tiny_model_dir("llama")).schedule() is None


def test_a_pretrained_model_is_no_earlier_run(tiny_model_dir):
    with pytest.raises(Exception, match="neither a checkpoint of a fit run"):
        load_trained_model(resolve_weights_source(tiny_model_dir("llama")))


@pytest.mark.parametrize("field", ["init_from", "teacher"])
def test_init_from_and_teacher_must_be_earlier_runs(field, tiny_model_dir):
    model_dir = tiny_model_dir("llama")  # exists, but is a pretrained model, not a checkpoint or an export
    kwargs = {"init_from": model_dir} if field == "init_from" else {"distillation": Distillation(teacher=model_dir)}
    with pytest.raises(UsageError, match="allowed the path of an existing checkpoint or export"):
        SkipLM(model=model_dir, schedule=Dense(), **kwargs)


def test_the_module_loads_an_export_whole(skip_export):
    path = skip_export("llama", "ranked")
    module = SkipLM(model=str(path))
    assert module.check_model().num_hidden_layers == 6  # an export is verified before it loads: its config
    record = module.load_weights()
    assert module.schedule == record.schedule == resolve_weights_source(path).schedule()
    assert module.get_tokenizer() is module.tokenizer and module.model is not None
    with module.scored_under(Dense().build(6)):
        assert module.scored_schedule == Dense().build(6)
    assert module.scored_schedule == module.schedule


def test_a_checkpoint_written_before_model_optimizer_and_peft_names_still_loads(tiny_model_dir, tmp_path):
    """Stored hyper-parameters in the earlier layout (flat optimiser keys, LoRA ``alpha``/``dropout``) are moved to
    today's, for the CLI's checkpoint parsing and for an earlier run loaded as a teacher or warm start."""
    model_dir = tiny_model_dir("llama")
    main(["fit", *tiny_args(model_dir, tmp_path / "fit", "--data.task", "builtin", "--data.max_train_samples", "4",
                            "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}",
                            "--model.optimizer.learning_rate", "0.05",
                            "--model.generation.num_batches", "0", "--trainer.max_steps", "1",
                            "--trainer.limit_val_batches", "0")])
    (ckpt,) = (tmp_path / "fit").rglob("*.ckpt")
    checkpoint = torch.load(ckpt, weights_only=False)
    hparams = checkpoint["hyper_parameters"]
    hparams.update(dict(hparams.pop("optimizer")))
    hparams["lora"] = {"r": 4, "alpha": 8, "dropout": 0}
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    assert upgrade_hparams(hparams)["optimizer"]["learning_rate"] == hparams["learning_rate"] == 0.05
    assert upgrade_hparams(hparams)["lora"] == {"r": 4, "lora_alpha": 8, "lora_dropout": 0}

    reference = load_trained_model(resolve_weights_source(ckpt))
    for name, tensor in load_trained_model(resolve_weights_source(old)).state_dict().items():
        assert torch.equal(tensor, reference.state_dict()[name])
    main(["export", "--model.model", model_dir, "--ckpt_path", str(old), "--output_dir", str(tmp_path / "export")])
    assert (tmp_path / "export" / "config.json").is_file()
