"""Write an export of a fine-tuned model with its skip schedule, all or nothing.

Everything goes to a temporary directory beside the target, is verified (:func:`~skiptrain.export.verify.verify_export`,
as when the export is loaded), and only then renamed into place (:mod:`skiptrain.core.output_dir`). A failed export
leaves neither the target nor the temporary directory behind. The files are those of :mod:`skiptrain.export.format`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from peft import PeftModel
from torch import nn

from skiptrain import shipped
from skiptrain.core import log
from skiptrain.core.output_dir import check_output_dir, staged_directory
from skiptrain.core.schedules import SkipSchedule
from skiptrain.core.speedup import cost_summary
from skiptrain.export.card import model_card
from skiptrain.export.format import (
    ADAPTER_ONLY_NEEDS_LORA,
    CONFIG_FILE,
    CONFIG_KEY,
    CUSTOM_GENERATE_FILE,
    MODEL_CARD_FILE,
    SCHEDULE_FILE,
    TRAINING_CONFIG_FILE,
    UNRECORDED_TRAINING_CONFIG,
    ExportUsageError,
    check_schedule_fits,
)
from skiptrain.export.record import ExportRecord, producer
from skiptrain.export.verify import check_exported_adapter, verify_export
from skiptrain.modeling.architectures import attention_for
from skiptrain.modeling.quantization import is_quantized, merge_into_dequantized
from skiptrain.shipped.draft_head import DRAFT_VOCAB_FILE


def merged_model(model: nn.Module, in_place: bool = False) -> nn.Module:
    """The plain transformers model with any LoRA adapters merged (a copy unless ``in_place``).

    A quantized (QLoRA) base is dequantized to float32 before the merge, always into a copy
    (:func:`~skiptrain.modeling.quantization.merge_into_dequantized`): the merged weights compute what the trained
    model did.
    """
    if not isinstance(model, PeftModel):
        return model
    if is_quantized(model):
        return merge_into_dequantized(model)
    return (model if in_place else copy.deepcopy(model)).merge_and_unload()


def _write_weights(model: nn.Module, directory: Path, adapter_only: bool, in_place: bool) -> None:
    if adapter_only:
        if not isinstance(model, PeftModel):
            raise ExportUsageError(ADAPTER_ONLY_NEEDS_LORA)
        model.save_pretrained(str(directory))
        check_exported_adapter(directory, model)
        return
    merged_model(model, in_place).save_pretrained(str(directory))


def _write_record(directory: Path, record: ExportRecord, adapter_only: bool) -> None:
    """The record's files: ``skip_schedule.json`` (with, for merged weights, its ``config.json`` mirror and the
    custom generate that reads it), the draft vocabulary when recorded, training config, model card."""
    text = record.schedule_json()
    (directory / SCHEDULE_FILE).write_text(text + "\n")
    if record.draft_vocab is not None:
        (directory / DRAFT_VOCAB_FILE).write_text(json.dumps(list(record.draft_vocab)) + "\n")
    if not adapter_only:
        path = directory / CONFIG_FILE
        config = json.loads(path.read_text())
        config[CONFIG_KEY] = json.loads(text)
        # an architecture that runs under one attention only (Gemma 2: eager) names it, so that plain transformers
        # loads it so on every supported release (before 5.21 it ran Gemma 2 under sdpa, without soft-capping)
        attention = attention_for(config.get("model_type", ""), "sdpa")
        if attention != "sdpa":
            config["attn_implementation"] = attention
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_custom_generate(directory)
    (directory / TRAINING_CONFIG_FILE).write_text(record.training_config or UNRECORDED_TRAINING_CONFIG)
    (directory / MODEL_CARD_FILE).write_text(model_card(record, adapter_only))


def write_custom_generate(directory: str | os.PathLike) -> Path:
    """Ship the :mod:`skiptrain.shipped` package as the export's ``custom_generate/`` folder, each module byte for
    byte: transformers' ``generate()`` with ``trust_remote_code=True`` then runs its ``generate.py`` (which imports
    its siblings relatively) and decodes under the ``config.json`` schedule, without skiptrain installed.

    Returns:
        The shipped ``custom_generate/generate.py``.
    """
    target = Path(directory) / CUSTOM_GENERATE_FILE
    target.parent.mkdir(exist_ok=True)
    for module in sorted(Path(shipped.__file__).parent.glob("*.py")):
        shutil.copyfile(module, target.parent / module.name)
    return target


def _num_layers(model: nn.Module) -> int:
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    return base.config.num_hidden_layers


def write_export(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    output_dir: str | os.PathLike,
    record: ExportRecord,
    adapter_only: bool = False,
    overwrite: bool = False,
    in_place: bool = False,
) -> Path:
    """Write an export directory, all or nothing.

    Args:
        model: The (possibly peft-wrapped) Hugging Face causal LM.
        tokenizer: Its tokenizer.
        schedule: The skip schedule it was trained with.
        output_dir: Target directory; must be absent or empty unless ``overwrite``.
        record: What to record about the run; its ``schedule`` and ``producer`` are set to ``schedule`` and this
            skiptrain.
        adapter_only: Save the LoRA adapter alone instead of merged weights.
        overwrite: Replace a non-empty ``output_dir``.
        in_place: Merge LoRA adapters into ``model`` itself (it is consumed) instead of into a copy.

    Returns:
        The export directory.

    Raises:
        OutputDirError: for a refused target (:mod:`skiptrain.core.output_dir`).
        ExportError: for a schedule built for another layer count, a model without adapters and ``adapter_only``,
            or a failed :func:`verify_export`. Nothing is left behind on any failure.
    """
    target = check_output_dir(output_dir, overwrite)
    check_schedule_fits(schedule, _num_layers(model), f"the schedule to export with {type(model).__name__}")
    record = dataclasses.replace(record, schedule=schedule, producer=producer())
    with staged_directory(target, overwrite) as staging:
        _write_weights(model, staging, adapter_only, in_place)
        tokenizer.save_pretrained(str(staging))
        _write_record(staging, record, adapter_only)
        verify_export(staging)
    log.info(f"skiptrain: exported to {target} ({'adapter' if adapter_only else 'merged weights'}, schedule "
             f"{schedule.family}: {cost_summary(schedule, [schedule.span])}, the schedule's span)")
    return target
