"""Verify an export against its contract: the same checks when it is written and when it is loaded.

Each defect has one outcome, an :class:`~skiptrain.export.format.ExportError` naming the file. The weights are
checked against the architecture built on the meta device (no memory), from the safetensors headers alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from skiptrain.core.key_diff import Shapes, diff_keys
from skiptrain.export.format import (
    ADAPTER_CONFIG_FILE,
    CONFIG_FILE,
    CONFIG_KEY,
    SCHEDULE_FILE,
    TOKENIZER_FILES,
    ExportError,
    check_schedule_fits,
    is_adapter_export,
    recorded_draft_vocab,
    schedule_from_export,
    training_config,
)
from skiptrain.export.record import ExportRecord
from skiptrain.modeling.loading import load_config


def saved_tensor_shapes(directory: str | os.PathLike, prefix: str = "model") -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in a directory's ``<prefix>*.safetensors`` files (headers only, no data).

    Raises:
        ExportError: naming the directory when it has no such file, or a file that is truncated or corrupt.
    """
    files = sorted(Path(directory).glob(f"{prefix}*.safetensors"))
    if not files:
        raise ExportError(f"{directory} has no {prefix}*.safetensors: its weights are missing; copy them back or "
                          "export again")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        except (OSError, SafetensorError) as err:
            raise ExportError(f"{file} is truncated or corrupt ({err}): copy it again or export again") from err
    return shapes


def expected_tensor_shapes(config: PretrainedConfig) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Tensors a checkpoint of this architecture holds, from the model built on the meta device (no memory).

    Returns:
        ``(shapes, tied)``: every state-dict tensor's shape, and the names of tied copies (e.g. ``lm_head.weight``
        with ``tie_word_embeddings``) that ``save_pretrained`` leaves out and ``from_pretrained`` re-ties.
    """
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    return shapes, set(getattr(model, "all_tied_weights_keys", None) or {})


def check_tensors(
    saved: Shapes, expected: Shapes, optional: set[str] | frozenset[str] = frozenset(), where: str = "export"
) -> None:
    """Refuse saved tensors whose names, shapes or sizes differ from the expected ones.

    Args:
        saved: Name -> shape of what was written.
        expected: Name -> shape the architecture needs.
        optional: Expected names that may be absent (tied copies).
        where: What was written, for the message.

    Raises:
        ExportError: naming every missing, unexpected, empty or mis-shaped tensor (see
            :func:`~skiptrain.core.key_diff.diff_keys`).
    """
    problems = ([] if saved else ["no tensors were written"]) + diff_keys(saved, expected, optional).problems()
    if problems:
        raise ExportError(f"{where} failed the tensor check: " + "; ".join(problems))


def check_exported_weights(directory: str | os.PathLike, config: PretrainedConfig | None = None) -> None:
    """Check a directory's safetensors against its architecture (``config``, default its ``config.json``)."""
    expected, tied = expected_tensor_shapes(config or AutoConfig.from_pretrained(directory))
    check_tensors(saved_tensor_shapes(directory), expected, tied, where=f"weights in {directory}")


def check_exported_adapter(directory: str | os.PathLike, model: PeftModel) -> None:
    """Check an adapter-only export's tensors against the adapter of ``model`` (the one saved or loaded)."""
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}  # peft saves these keys
    check_tensors(saved_tensor_shapes(directory, prefix="adapter_model"), expected, where=f"adapter in {directory}")


def _merged_config(directory: Path) -> PretrainedConfig:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise ExportError(f"{path} is missing: an export of merged weights has {CONFIG_FILE} (an adapter-only "
                          f"export has {ADAPTER_CONFIG_FILE})")
    try:
        return AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as err:
        raise ExportError(f"{path} is not a readable model config: {err}") from err


def _check_mirror(directory: Path, schedule_object: Mapping[str, Any]) -> None:
    path = directory / CONFIG_FILE
    mirrored = json.loads(path.read_text()).get(CONFIG_KEY)
    if mirrored != schedule_object:
        state = "has no" if mirrored is None else "has a different"
        raise ExportError(f"{path} {state} '{CONFIG_KEY}' key: allowed only an exact copy of "
                          f"{directory / SCHEDULE_FILE}")


def verify_export(directory: str | os.PathLike) -> ExportRecord:
    """Check an export against its contract, when it is written and when it is loaded alike.

    Each defect is refused with an :class:`ExportError` naming the file, checked in this order:
    ``skip_schedule.json`` missing, not JSON or not a valid schedule; an adapter-only export without
    ``base_model``; the schedule's ``num_layers`` differing from the architecture's decoder layers (``config.json``,
    or the base model's for an adapter); and, for merged weights, a missing or unreadable ``config.json``, a
    ``config.json`` whose ``skip_schedule`` key is not an exact copy of ``skip_schedule.json``, and safetensors
    with missing, unexpected, empty or mis-shaped tensors. (An adapter's tensors are checked against the peft
    model they are saved from or loaded into: :func:`check_exported_adapter`.) A recorded ``draft_vocab_size``
    whose ``draft_vocab.json`` is missing or does not hold that many distinct ids of the vocabulary is refused.
    Last, an export without tokenizer files is refused.

    Returns:
        The export's record.
    """
    return _verified(Path(directory))[0]


def export_config(directory: str | os.PathLike) -> PretrainedConfig:
    """The architecture an export decodes with (``config.json``, or the base model's for an adapter), once the
    export passes :func:`verify_export`; no weights are read."""
    return _verified(Path(directory))[1]


def check_tokenizer_files(directory: Path) -> None:
    """Refuse an export without a tokenizer's vocabulary file (transformers would blame a missing package)."""
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ExportError(f"{directory} has no tokenizer files (none of {list(TOKENIZER_FILES)}): copy them back "
                          "from the base model (its tokenizer's save_pretrained) or export again")


def _verified(directory: Path) -> tuple[ExportRecord, PretrainedConfig]:
    schedule, raw = schedule_from_export(directory)
    record = ExportRecord.from_schedule_file(schedule, raw, training_config(directory))
    adapter = is_adapter_export(directory)
    if adapter and not record.base_model:
        raise ExportError(f"{directory / SCHEDULE_FILE}: base_model={record.base_model!r} is invalid for an "
                          "adapter-only export: allowed the name of the model the adapter applies to")
    config = load_config(record.base_model) if adapter else _merged_config(directory)
    check_schedule_fits(schedule, config.num_hidden_layers, directory / SCHEDULE_FILE)
    record = dataclasses.replace(record, draft_vocab=recorded_draft_vocab(directory, raw, config.vocab_size))
    if not adapter:
        _check_mirror(directory, raw)
        check_exported_weights(directory, config)
    check_tokenizer_files(directory)
    return record, config
