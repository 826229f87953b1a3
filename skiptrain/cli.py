"""Command line: ``python -m skiptrain fit|validate|test|predict --config recipe.yaml`` (LightningCLI)."""

from __future__ import annotations

from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from skiptrain.data import SkipDataModule
from skiptrain.module import SkipLM
from skiptrain.schedules import ScheduleFamily


class SkipCLI(LightningCLI):
    """LightningCLI with the links between model and data that must agree."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # One model name drives both the weights and the tokenizer.
        parser.link_arguments("model.model", "data.tokenizer")


def main(args: list[str] | None = None, run: bool = True) -> SkipCLI:
    """Entry point of the ``skiptrain`` console script; ``args`` lets tests run the CLI in-process.

    With ``run=False`` the configuration is parsed and instantiated without running a subcommand.
    """
    set_parsing_settings(subclasses_enabled=[ScheduleFamily])  # schedules are given by class_path
    return SkipCLI(
        SkipLM,
        SkipDataModule,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"parser_mode": "yaml"},
    )
