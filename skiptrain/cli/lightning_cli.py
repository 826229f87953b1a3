"""The LightningCLI behind ``skiptrain fit|validate|test|predict|export|generate|evaluate|calibrate|conformance``.

``fit``, ``validate``, ``test`` and ``predict`` are LightningCLI's; ``export``, ``generate``, ``evaluate``,
``calibrate`` and ``conformance`` are methods of :class:`~skiptrain.cli.trainer.SkipTrainer` whose typed arguments
become options (``--output_dir``, ``--prompts``, ...). :data:`DATA_MODULE` says which of them need a data module:
for the others the ``data`` section is optional. Adding a subcommand is a SkipTrainer method, one line in
:meth:`SkipCLI.subcommands`, one in :data:`DATA_MODULE` and one in :data:`skiptrain.cli.app.SUBCOMMANDS`.
``generate`` of an export never gets here: :mod:`skiptrain.cli.generate` runs it without Lightning.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from skiptrain.callbacks.export import ExportCallback
from skiptrain.cli.progress import ProgressBar
from skiptrain.cli.run_summary import RunSummary
from skiptrain.cli.trainer import SkipTrainer
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.errors import SkiptrainError, UsageError
from skiptrain.modeling.loading import context_length
from skiptrain.shipped.prompt_format import PromptFormatError
from skiptrain.training.checkpoints import checkpoint_layout, checkpoint_metadata, resolve_ckpt_path
from skiptrain.training.module import SkipLM, accept_schedule_families
from skiptrain.training.preemption import PreemptionCheckpoint
from skiptrain.training.runs import RUN_CONFIG_FILE
from skiptrain.training.settings import upgrade_hparams
from skiptrain.training.strategies import release_process_group

PROGRAM = "skiptrain"
DESCRIPTION = ("skiptrain: skip-aware fine-tuning of causal language models (SkipDecode), their export, and batched "
               "skip-aware decoding.")

DATA_MODULE = {"export": "optional", "generate": "unused", "evaluate": "required", "calibrate": "required",
               "conformance": "unused"}
"""Whether each of SkipTrainer's subcommands needs a data module (``required``), records it when one is given
(``optional``: ``export`` keeps the task name), or never uses it (``unused``: its method has no ``datamodule``
parameter). Lightning's own subcommands require one."""
FROM_CONFIG = {"model", "datamodule"}
"""Arguments of a SkipTrainer subcommand that the CLI builds from the config rather than parsing as options."""
DEBUG_VARIABLE = "SKIPTRAIN_DEBUG"
"""Environment variable: set to 1 to show the traceback of a user error too."""


class SkipCLI(LightningCLI):
    """LightningCLI with skiptrain's subcommands and the links between model and data that must agree."""

    _building: str | None = None  # the subcommand whose parser is being built

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """LightningCLI's subcommands plus SkipTrainer's, one line each."""
        return {
            **LightningCLI.subcommands(),
            "export": FROM_CONFIG,
            "generate": FROM_CONFIG,
            "evaluate": FROM_CONFIG,
            "calibrate": FROM_CONFIG,
            "conformance": FROM_CONFIG,
        }

    def _data_optional(self) -> bool:
        """Whether the subcommand being built runs without a data module (:data:`DATA_MODULE`).

        ``--data.*`` may still be given then, e.g. by a run's config.yaml.
        """
        return DATA_MODULE.get(self._building, "required") != "required"

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        self._building = subcommand
        try:
            return super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        finally:
            self._building = None

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        if not self._data_optional():
            super().add_core_arguments_to_parser(parser)
            return
        # As LightningCLI, except that the data module may be left out (it is then None).
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({"trainer." + k: v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self.model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(self.datamodule_class, "data", subclass_mode=True, required=False)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # One model name drives both the weights and the tokenizer.
        tokenizer = "data.init_args.tokenizer" if self._data_optional() else "data.tokenizer"
        parser.link_arguments("model.model", tokenizer)

    def after_instantiate_classes(self) -> None:
        """A data module configured for a subcommand that never uses one (e.g. by a run's config.yaml) is dropped."""
        if DATA_MODULE.get(self.subcommand) == "unused":
            self.datamodule = None

    def instantiate_trainer(self, **kwargs: Any) -> SkipTrainer:
        """As LightningCLI's, with Lightning's default rich progress bar replaced by :class:`ProgressBar`, its model
        summary table by :class:`~skiptrain.cli.run_summary.RunSummary`, and a
        :class:`~skiptrain.training.preemption.PreemptionCheckpoint` added."""
        trainer = super().instantiate_trainer(**kwargs)
        replaced = {RichProgressBar: ProgressBar, ModelSummary: RunSummary, RichModelSummary: RunSummary}
        trainer.callbacks = [replaced[type(c)]() if type(c) in replaced else c for c in trainer.callbacks]
        if not any(isinstance(c, PreemptionCheckpoint) for c in trainer.callbacks):
            trainer.callbacks.append(PreemptionCheckpoint())
        return trainer

    def _parse_ckpt_path(self) -> None:
        """As LightningCLI's (a checkpoint's hyper-parameters configure the model), with three differences.

        ``last`` is resolved to the newest ``last.ckpt`` of the run
        (:func:`~skiptrain.training.checkpoints.resolve_ckpt_path`).

        An unreadable checkpoint is refused by name (:class:`~skiptrain.training.checkpoints.CheckpointError`), and
        the model named by ``model.model`` (on the command line or in a config) is the one used, not the checkpoint's:
        a base model moved since training still loads, and an export given with a checkpoint is refused when loaded.
        """
        subcommand = self.config.get("subcommand")
        settings = self.config.get(subcommand) if subcommand else None
        ckpt_path = settings.get("ckpt_path") if settings is not None else None
        if ckpt_path:
            root = settings.trainer.get("default_root_dir") or os.getcwd()  # Lightning's default
            ckpt_path = settings.ckpt_path = resolve_ckpt_path(ckpt_path, root)
        if not ckpt_path or checkpoint_layout(ckpt_path) != "file":
            return
        hparams = upgrade_hparams(checkpoint_metadata(ckpt_path, settings.get("weights_only")).get("hyper_parameters")
                                  or {})
        hparams.pop("_instantiator", None)
        given, stored = settings.model.get("model"), hparams.get("model")
        if given and stored and given != stored:
            hparams.pop("model")
            rank_zero_info(f"skiptrain: model.model={given!r} is used; the checkpoint {ckpt_path} was trained from "
                           f"model={stored!r}")
        if hparams:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)

    def _run_subcommand(self, subcommand: str) -> None:
        """Check the model, its schedule and the data's length limits before a run directory or output is written.

        A user error found later (e.g. in the data, which Lightning sets up after creating the run's log directory)
        removes the log directory this command created, while it holds nothing but the configuration.
        """
        config = self.model.check_model(self.trainer.strategy)
        if config is not None and self.datamodule is not None:
            self.datamodule.check_context(context_length(config))
        if subcommand == "fit":
            for callback in self.trainer.callbacks:
                if isinstance(callback, ExportCallback):
                    callback.check_target()
        created = _absent(Path(self.trainer.log_dir)) if self.trainer.log_dir else []
        try:
            super()._run_subcommand(subcommand)
        except (SkiptrainError, PromptFormatError):
            _remove_if_only_setup_files(created)
            raise


SETUP_FILES = {RUN_CONFIG_FILE, "hparams.yaml"}
"""What a run's log directory holds before training starts (the configuration)."""


def _absent(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, deepest first."""
    absent = []
    while not path.exists() and path != path.parent:
        absent.append(path)
        path = path.parent
    return absent


def _remove_if_only_setup_files(created: list[Path]) -> None:
    """Remove directories a failed command created (``created``, deepest first) if they hold only setup files."""
    if not created or not created[0].is_dir():
        return
    if any(p.is_file() and p.name not in SETUP_FILES for p in created[0].rglob("*")):
        return  # the run got further: keep what it wrote
    shutil.rmtree(created[0])
    for parent in created[1:]:
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()


def lightning_cli(args: list[str] | None = None, run: bool = True) -> SkipCLI:
    """Run (or with ``run=False`` only parse and instantiate) a command through :class:`SkipCLI`.

    Multi-process runs end their process group when the process exits
    (:func:`~skiptrain.training.strategies.release_process_group`).
    """
    accept_schedule_families()
    release_process_group()
    refuse_optimizer_options(sys.argv[1:] if args is None else args)
    return SkipCLI(
        SkipLM,
        SkipDataModule,
        trainer_class=SkipTrainer,
        args=args,
        run=run,
        auto_configure_optimizers=False,  # SkipLM.configure_optimizers builds AdamW: see NOT_OPTIONS
        save_config_kwargs={"overwrite": True},
        # its errors are formatted by skiptrain.cli.app; "skiptrain", not __main__.py, in the usage line
        parser_kwargs={"parser_mode": "yaml", "exit_on_error": False, "prog": PROGRAM, "description": DESCRIPTION},
    )


NOT_OPTIONS = {
    "--optimizer": "the optimizer is AdamW over the trainable weights, which exist only once the model is built: set "
                   "--model.optimizer.learning_rate, --model.optimizer.betas and --model.optimizer.weight_decay",
    "--lr_scheduler": "the learning-rate schedule is --model.optimizer.lr_schedule (cosine, linear or constant) "
                      "after --model.optimizer.warmup_steps of linear warm-up",
}
"""LightningCLI's options that skiptrain leaves out, each with what to set instead."""


def refuse_optimizer_options(args: Sequence[str]) -> None:
    """Refuse LightningCLI's ``--optimizer`` and ``--lr_scheduler`` (and their ``.``-options) by name.

    Raises:
        UsageError: naming the option and what configures the optimizer instead.
    """
    for arg in args:
        name = arg.split("=", 1)[0]
        for option, instead in NOT_OPTIONS.items():
            if name == option or name.startswith(option + "."):
                raise UsageError(f"{name} is not an option of skiptrain: {instead}")


USER_ERRORS = (MisconfigurationException,)
"""Lightning's exceptions that report a mistake in the user's input (e.g. an accelerator this machine lacks)."""
