"""The export format: its file names, its errors, and reading an export's schedule and record.

An export (the contract of ``docs/export-format.md``) is a normal Hugging Face model directory, loadable densely by
plain ``AutoModelForCausalLM.from_pretrained``, plus its :class:`~skiptrain.export.record.ExportRecord`:

- ``skip_schedule.json``: the schedule as layer lists (:meth:`~skiptrain.core.schedules.SkipSchedule.to_json`) with
  ``producer``, ``trained_with_schedule`` and ``base_model``; the same object is mirrored under the key
  ``skip_schedule`` in ``config.json``;
- ``training_config.yaml``: the resolved LightningCLI config of the run (or, when none is found, the model and
  data hyperparameters stored in the checkpoint);
- ``README.md``: a model card (:mod:`skiptrain.export.card`);
- ``custom_generate/`` (merged weights only): a copy of :mod:`skiptrain.shipped`, whose ``generate.py`` makes plain
  transformers ``generate()`` decode under the schedule when the export is loaded with ``trust_remote_code=True``.

With ``adapter_only`` the directory holds the peft adapter (``adapter_config.json``, ``adapter_model.safetensors``)
instead of merged weights; ``skip_schedule.json`` names the base model the adapter applies to. Exports are written
by :mod:`skiptrain.export.write`, checked by :mod:`skiptrain.export.verify` and loaded by :mod:`skiptrain.export.load`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from skiptrain.core.schedules import ScheduleError, SkipSchedule
from skiptrain.errors import InputError, UsageError
from skiptrain.export.record import NOT_RECORDED, ExportRecord

SCHEDULE_FILE = "skip_schedule.json"
CONFIG_FILE = "config.json"
CONFIG_KEY = "skip_schedule"
ADAPTER_CONFIG_FILE = "adapter_config.json"
TRAINING_CONFIG_FILE = "training_config.yaml"
MODEL_CARD_FILE = "README.md"
CUSTOM_GENERATE_FILE = "custom_generate/generate.py"
UNRECORDED_TRAINING_CONFIG = f"# training config: {NOT_RECORDED}\n"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Vocabulary files, one of which every tokenizer's ``save_pretrained`` writes."""
ADAPTER_ONLY_NEEDS_LORA = "adapter_only=True needs a LoRA model (model.lora is null): export merged weights"


class ExportError(InputError):
    """An export cannot be written or an export directory cannot be used (the message says which file and why)."""


class ExportUsageError(ExportError, UsageError):
    """An export refused for its options: a non-empty ``output_dir``, ``adapter_only`` without LoRA, an export
    combined with a checkpoint."""

    exit_code = UsageError.exit_code


def is_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a ``skip_schedule.json``, or one written as an export that lost it.

    An export whose ``skip_schedule.json`` is gone still has its ``training_config.yaml`` (or the schedule's copy in
    ``config.json``): it counts as an export, so that loading it is refused (:func:`schedule_from_export`) rather
    than decoding its weights under another schedule.
    """
    directory = Path(path)
    return (directory / SCHEDULE_FILE).is_file() or (directory / TRAINING_CONFIG_FILE).is_file()


def is_adapter_export(directory: str | os.PathLike) -> bool:
    """Whether an export holds a peft adapter (``adapter_config.json``) rather than merged weights."""
    return (Path(directory) / ADAPTER_CONFIG_FILE).is_file()


def schedule_from_export(directory: str | os.PathLike) -> tuple[SkipSchedule, dict[str, Any]]:
    """Read and validate an export's ``skip_schedule.json``.

    Returns:
        The schedule and the raw JSON object (what ``config.json`` must mirror).

    Raises:
        ExportError: naming the file when it is missing, is not valid JSON, or breaks the contract (unknown
            ``format`` or ``schema_version``, missing keys, layer lists that are not nested, ...).
    """
    path = Path(directory) / SCHEDULE_FILE
    if not path.is_file() and (Path(directory) / TRAINING_CONFIG_FILE).is_file():
        raise ExportError(
            f"{path} is missing: {directory} was written as a skiptrain export ({TRAINING_CONFIG_FILE}) but has lost "
            f"its schedule, so its weights would decode under one they were not trained for; restore {SCHEDULE_FILE} "
            f"(config.json of merged weights keeps a copy under '{CONFIG_KEY}') or export again"
        )
    if not path.is_file():
        raise ExportError(
            f"{path} is missing: {directory} is not a skiptrain export (every export has {SCHEDULE_FILE}; "
            "write one with `skiptrain export`)"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ExportError(f"{path} is not valid JSON: {err}") from err
    try:
        return SkipSchedule.from_dict(raw), raw
    except ScheduleError as err:
        raise ExportError(f"{path} is not a valid skip schedule: {err}") from err


def read_record(directory: str | os.PathLike) -> ExportRecord:
    """The :class:`~skiptrain.export.record.ExportRecord` of an export, unverified (see :func:`verify_export`).

    Raises:
        ExportError: as :func:`schedule_from_export`.
    """
    schedule, raw = schedule_from_export(directory)
    return ExportRecord.from_schedule_file(schedule, raw, training_config(Path(directory)))


def training_config(directory: Path) -> str | None:
    """An export's ``training_config.yaml``, or ``None`` when absent or written as not recorded."""
    path = directory / TRAINING_CONFIG_FILE
    text = path.read_text() if path.is_file() else None
    return None if text == UNRECORDED_TRAINING_CONFIG else text



def check_schedule_fits(schedule: SkipSchedule, num_layers: int, where: str | os.PathLike) -> None:
    """Refuse a schedule whose ``num_layers`` disagrees with the model's decoder layer count, naming ``where``."""
    try:
        schedule.check_num_layers(num_layers)
    except ScheduleError as err:
        raise ExportError(f"{where}: {err}") from err
