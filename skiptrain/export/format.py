"""The export format: its file names, its errors, and reading an export's schedule and record.

An export (the contract of ``docs/export-format.md``) is a normal Hugging Face model directory, loadable densely by
plain ``AutoModelForCausalLM.from_pretrained``, plus its :class:`~skiptrain.export.record.ExportRecord`:

- ``skip_schedule.json``: the schedule as layer lists (:meth:`~skiptrain.core.schedules.SkipSchedule.to_json`) with
  ``producer``, ``trained_with_schedule`` and ``base_model``; the same object is mirrored under the key
  ``skip_schedule`` in ``config.json``;
- ``training_config.yaml``: the resolved LightningCLI config of the run (or, when none is found, the model and
  data hyperparameters stored in the checkpoint);
- ``README.md``: a model card (:mod:`skiptrain.export.card`);
- ``draft_vocab.json`` (optional): the token ids lossless speculative decoding drafts from, most frequent first,
  its size recorded as ``draft_vocab_size`` in ``skip_schedule.json``;
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
from skiptrain.shipped.draft_head import DRAFT_VOCAB_FILE, DRAFT_VOCAB_SIZE_KEY, draft_vocab_problem

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
    return ExportRecord.from_schedule_file(schedule, raw, training_config(Path(directory)),
                                           recorded_draft_vocab(Path(directory), raw))


def read_draft_vocab(path: str | os.PathLike, vocab_size: int | None = None, size: int | None = None
                     ) -> tuple[int, ...]:
    """The token ids of a draft vocabulary file (a JSON list, most frequent first).

    Args:
        path: The file.
        vocab_size: The model's vocabulary size, when known: every id must be below it.
        size: How many ids the file must hold, when recorded.

    Raises:
        InputError: naming the file when it is missing, not JSON, or not distinct token ids (of ``size``).
    """
    try:
        ids = json.loads(Path(path).read_text())
    except FileNotFoundError as err:
        raise InputError(f"{path} is missing: a draft vocabulary is a JSON list of token ids") from err
    except (OSError, json.JSONDecodeError) as err:
        raise InputError(f"{path} cannot be read as JSON: {' '.join(str(err).split())}") from err
    problem = draft_vocab_problem(ids, vocab_size if vocab_size is not None else 2**63)
    if problem is None and size is not None and len(ids) != size:
        problem = f"allowed {size} ids ({DRAFT_VOCAB_SIZE_KEY}={size} in {SCHEDULE_FILE})"
    if problem is not None:
        raise InputError(f"{path} is not a draft vocabulary: {problem}")
    return tuple(ids)


def recorded_draft_vocab(directory: Path, raw: dict[str, Any], vocab_size: int | None = None
                         ) -> tuple[int, ...] | None:
    """The draft vocabulary an export records (``draft_vocab_size`` in its ``skip_schedule.json`` object ``raw``),
    or ``None``.

    Raises:
        ExportError: naming ``draft_vocab.json`` when it is missing or does not hold that many valid ids.
    """
    size = raw.get(DRAFT_VOCAB_SIZE_KEY)
    if size is None:
        return None
    try:
        return read_draft_vocab(directory / DRAFT_VOCAB_FILE, vocab_size, size)
    except InputError as err:
        raise ExportError(f"{err}; restore it or export again") from err


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
