"""What the command line promises beyond Lightning's: ``--ckpt_path last``, the prediction writer, no optimizer
options, and the LightningCLI hooks it relies on."""

from __future__ import annotations

import inspect
import json

import pytest
from helpers.cli_args import tiny_args
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

from skiptrain.cli.app import SUBCOMMANDS, main
from skiptrain.cli.lightning_cli import SkipCLI
from skiptrain.export.format import read_record
from skiptrain.training.checkpoints import resolve_ckpt_path
from skiptrain.training.strategies import SkipDeepSpeedStrategy, SkipFSDPStrategy

COMMON = ("--data.task", "builtin", "--data.max_train_samples", "4",
          "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}",
          "--model.generation.num_batches", "0")


def test_ckpt_path_last_is_the_newest_last_ckpt_of_the_run(tiny_model_dir, tmp_path):
    model = tiny_model_dir("llama")
    run = tmp_path / "run"
    main(["fit", *tiny_args(model, run, *COMMON, "--trainer.max_steps", "1"),
          "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_last", "true"])
    (last,) = run.rglob("last.ckpt")
    assert resolve_ckpt_path("last", run) == str(last)
    main(["export", "--model.model", model, "--trainer.default_root_dir", str(run), "--ckpt_path", "last",
          "--output_dir", str(tmp_path / "export")])
    assert read_record(tmp_path / "export").trained_with_schedule  # the checkpoint's weights, not the base model's


def test_predict_writes_json_lines_with_the_prediction_writer(tiny_model_dir, tmp_path):
    output = tmp_path / "out" / "predictions.jsonl"
    main(["predict", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", *COMMON, "--data.max_eval_samples", "3"),
          "--trainer.callbacks+=skiptrain.callbacks.predictions.PredictionWriter",
          "--trainer.callbacks.output", str(output)])
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == 3
    assert all(set(r) == {"source", "prediction"} and r["source"] for r in records)


def test_the_entry_point_knows_every_subcommand_of_the_lightning_cli():
    """The entry point names the subcommands before it imports LightningCLI: the two lists are one."""
    assert list(SUBCOMMANDS) == list(SkipCLI.subcommands())


def test_the_optimizer_options_are_not_offered(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    shown = capsys.readouterr().out
    assert "--model.optimizer OPTIMIZER" in shown and "--model.optimizer.help" in shown
    assert "--optimizer" not in shown and "--lr_scheduler" not in shown
    with pytest.raises(SystemExit):
        main(["fit", "--model.optimizer.help"])
    assert "--model.optimizer.learning_rate" in capsys.readouterr().out


# -- Lightning's private hooks that skiptrain overrides: what it relies on, so that an upgrade that changes them
# fails here by name rather than somewhere in a run --------------------------------------------------------------------
PRIVATE_HOOKS = [
    # (Lightning class, skiptrain's subclass, hook, its parameters, how Lightning calls it)
    (LightningCLI, SkipCLI, "_prepare_subcommand_parser", ["self", "klass", "subcommand", "kwargs"],
     "self._prepare_subcommand_parser(trainer_class, subcommand, **subparser_kwargs)"),
    (LightningCLI, SkipCLI, "_parse_ckpt_path", ["self"], "self._parse_ckpt_path()"),
    (LightningCLI, SkipCLI, "_run_subcommand", ["self", "subcommand"], "self._run_subcommand(self.subcommand)"),
    (FSDPStrategy, SkipFSDPStrategy, "_setup_model", ["self", "model"], "self.model = self._setup_model(self.model)"),
    (DeepSpeedStrategy, SkipDeepSpeedStrategy, "_init_optimizers", ["self"], ") = self._init_optimizers()"),
]


@pytest.mark.parametrize(("base", "subclass", "hook", "parameters", "call"), PRIVATE_HOOKS,
                         ids=[f"{base.__name__}.{hook}" for base, _, hook, _, _ in PRIVATE_HOOKS])
def test_the_private_lightning_hooks_skiptrain_overrides_keep_their_contract(base, subclass, hook, parameters, call):
    assert list(inspect.signature(getattr(base, hook)).parameters) == parameters
    assert getattr(subclass, hook) is not getattr(base, hook)
    assert call in inspect.getsource(base)


def test_lightning_cli_parses_the_checkpoint_between_the_arguments_and_the_classes():
    """SkipCLI._parse_ckpt_path reads ``self.config`` after parsing and changes it before instantiation."""
    init = inspect.getsource(LightningCLI.__init__)
    order = [init.index(call) for call in ("self.parse_arguments(", "self._parse_ckpt_path()",
                                           "self.instantiate_classes()", "self._run_subcommand(")]
    assert order == sorted(order)
