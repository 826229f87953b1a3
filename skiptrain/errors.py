"""Errors in what a user gave skiptrain: options, models, data, prompts, checkpoints and exports.

Library functions raise these typed errors, worded to be shown as they are: what is wrong, which input, and how to
fix it. Only the command line formats them (one line on stderr, :data:`UsageError.exit_code` or
:data:`InputError.exit_code`); a Python caller catches them like any ``ValueError``. Any other exception is a bug
and keeps its traceback.
"""

from __future__ import annotations


class SkiptrainError(ValueError):
    """A mistake in the user's input, whose message says what is wrong, which input and how to fix it."""

    exit_code = 1


class UsageError(SkiptrainError):
    """An invalid option or combination of options, refused before any work (the command line exits 2)."""

    exit_code = 2


class InputError(SkiptrainError):
    """A file or directory given as input is missing or unusable (the command line exits 1)."""

    exit_code = 1


class ModelError(InputError):
    """A model (hub id, directory, GGUF file or bundled name) cannot be loaded."""


class DataError(InputError):
    """A data file or dataset split cannot be used for the task."""


class PromptError(InputError):
    """A prompt file (or stdin) cannot be read as prompts, or a prompt does not fit the model."""


__all__ = ["DataError", "InputError", "ModelError", "PromptError", "SkiptrainError", "UsageError"]
