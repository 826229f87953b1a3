"""Command line: ``python -m skiptrain fit|validate|test|predict|export|generate|evaluate|calibrate --config x.yaml``.

``fit``, ``validate``, ``test`` and ``predict`` are LightningCLI's; ``export``, ``generate``, ``evaluate`` and
``calibrate`` are methods of :class:`~skiptrain.trainer.SkipTrainer` whose typed arguments become options
(``--output_dir``, ``--prompts``, ...). A subcommand whose method takes ``datamodule=None`` (``export``,
``generate``) needs no data module: for it the ``data`` section is optional. Adding a subcommand is a SkipTrainer
method and one line in :meth:`SkipCLI.subcommands`.
"""

from __future__ import annotations

import inspect
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from skiptrain.data import SkipDataModule
from skiptrain.module import SkipLM, accept_schedule_families
from skiptrain.strategies import release_process_group
from skiptrain.trainer import SkipTrainer

FROM_CONFIG = {"model", "datamodule"}
"""Arguments of a SkipTrainer subcommand that the CLI builds from the config rather than parsing as options."""


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
        }

    def _data_optional(self) -> bool:
        """Whether the subcommand being built runs without a data module (its method takes ``datamodule=None``).

        ``--data.*`` may still be given then, e.g. by a run's config.yaml.
        """
        if self._building is None or self._building in LightningCLI.subcommands():
            return False
        parameters = inspect.signature(getattr(self.trainer_class, self._building)).parameters
        return parameters["datamodule"].default is None

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
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(self._datamodule_class, "data", subclass_mode=True, required=False)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # One model name drives both the weights and the tokenizer.
        tokenizer = "data.init_args.tokenizer" if self._data_optional() else "data.tokenizer"
        parser.link_arguments("model.model", tokenizer)


def main(args: list[str] | None = None, run: bool = True) -> SkipCLI:
    """Entry point of the ``skiptrain`` console script; ``args`` lets tests run the CLI in-process.

    With ``run=False`` the configuration is parsed and instantiated without running a subcommand. Multi-process
    runs end their process group when the process exits (:func:`~skiptrain.strategies.release_process_group`).
    """
    accept_schedule_families()
    release_process_group()
    return SkipCLI(
        SkipLM,
        SkipDataModule,
        trainer_class=SkipTrainer,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"parser_mode": "yaml"},
    )
