"""Command line: ``skiptrain fit|validate|test|predict|export|generate|evaluate|calibrate|conformance ...``.

``generate`` of an export runs without Lightning (:mod:`skiptrain.cli.generate`, its own parser); every other
command, and ``generate`` of a base model with a fit run's checkpoint, runs through LightningCLI
(:mod:`skiptrain.cli.lightning_cli`), imported only then.

Errors in the user's input (:class:`~skiptrain.errors.SkiptrainError`, and Lightning's
``MisconfigurationException``, e.g. an accelerator this machine lacks) end the command with one line on stderr,
``skiptrain <subcommand>: error: <message>``, and exit code 2 (options) or 1 (input files); ``SKIPTRAIN_DEBUG=1``
shows their traceback as well. The parsers' own errors (unknown or mistyped options) get the same one line and
exit 2. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from argparse import ArgumentError
from collections.abc import Sequence
from typing import Any

from skiptrain.cli.quiet import silence_third_party_noise
from skiptrain.errors import SkiptrainError, UsageError
from skiptrain.shipped.prompt_format import PromptFormatError

SUBCOMMANDS = ("fit", "validate", "test", "predict", "export", "generate", "evaluate", "calibrate", "conformance")
"""LightningCLI's subcommands, then skiptrain's (:meth:`~skiptrain.cli.lightning_cli.SkipCLI.subcommands`)."""
DEBUG_VARIABLE = "SKIPTRAIN_DEBUG"
"""Environment variable: set to 1 to show the traceback of a user error too."""


def subcommand_of(args: Sequence[str]) -> str:
    """The subcommand named in ``args`` (the first that is one), or ``""``."""
    return next((arg for arg in args if arg in SUBCOMMANDS), "")


def error_line(subcommand: str, error: BaseException | str) -> str:
    """``skiptrain <subcommand>: error: <message>``, on one line."""
    program = f"skiptrain {subcommand}" if subcommand else "skiptrain"
    return f"{program}: error: {' '.join(str(error).split())}"


def exit_code(error: BaseException) -> int:
    """2 for a usage error (an option or combination of options), 1 for an unusable input file."""
    return getattr(error, "exit_code", UsageError.exit_code)


def main(args: list[str] | None = None, run: bool = True) -> Any:
    """Entry point of the ``skiptrain`` console script; ``args`` lets tests run the CLI in-process.

    Returns the :class:`~skiptrain.cli.lightning_cli.SkipCLI` that ran the command, or for ``generate`` of an export
    its :class:`~skiptrain.frontends.speed.GenerationReport`. With ``run=False`` LightningCLI's configuration is
    parsed and instantiated without running a subcommand.

    A user error (:func:`user_errors`) prints :func:`error_line` and raises ``SystemExit`` with :func:`exit_code`
    (with ``SKIPTRAIN_DEBUG=1`` it propagates as it is); any other exception propagates.
    """
    given = sys.argv[1:] if args is None else list(args)
    silence_third_party_noise()
    try:
        if run and subcommand_of(given) == "generate":
            from skiptrain.cli import generate

            rest = given[given.index("generate") + 1:]
            if not generate.wants_training_stack(rest):
                return generate.main(rest)
        from skiptrain.cli.lightning_cli import lightning_cli

        return lightning_cli(args, run)
    except Exception as err:
        user_error = _user_error(err)
        if user_error is None or os.environ.get(DEBUG_VARIABLE, "0") not in ("", "0"):
            raise
        print(error_line(subcommand_of(given), _moved_option(user_error) or user_error), file=sys.stderr)
        raise SystemExit(exit_code(user_error)) from None


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that report a mistake in the user's input; any other is a bug. Lightning's count once it is
    loaded (a command that never loads it cannot raise them)."""
    lightning = sys.modules.get("skiptrain.cli.lightning_cli")
    return (SkiptrainError, PromptFormatError, ArgumentError, *(lightning.USER_ERRORS if lightning else ()))


def _moved_option(error: BaseException) -> str | None:
    """For an option refused because it moved (e.g. ``model.learning_rate``), the line naming where it is now."""
    if not isinstance(error, ArgumentError) or "skiptrain.cli.lightning_cli" not in sys.modules:
        return None
    from skiptrain.training.settings import moved_option  # loaded with the training stack already

    return moved_option(str(error))


def _user_error(error: BaseException | None) -> BaseException | None:
    """``error`` if it is a user error, else the user error it was raised from (the parser wraps those raised while
    it builds a class, e.g. ``SamplingConfig(top_p=1.5)``), else ``None``."""
    errors = user_errors()
    while error is not None and not isinstance(error, errors):
        error = error.__cause__  # explicit causes only: an error raised while handling another may be a bug
    return error
