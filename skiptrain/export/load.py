"""Load an export for skip-aware inference: verified first, then its weights, schedule and tokenizer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from torch import nn

from skiptrain.core.schedules import SkipSchedule
from skiptrain.export.format import is_adapter_export
from skiptrain.export.hub import hub_export
from skiptrain.export.record import ExportRecord
from skiptrain.export.verify import check_exported_adapter, verify_export
from skiptrain.export.write import merged_model
from skiptrain.modeling.loading import load_causal_lm, prepare_tokenizer
from skiptrain.modeling.quantization import Quantization


@dataclass(frozen=True)
class ExportedModel:
    """An export loaded for inference; unpacks as ``model, schedule, tokenizer``.

    Args:
        model: The causal LM in eval mode (adapters merged into the base for adapter-only exports).
        tokenizer: The export's tokenizer, left-padding.
        record: The export's record (schedule, ``base_model``, ``trained_with_schedule``, ...).
        path: The export directory.
    """

    model: nn.Module
    tokenizer: Any
    record: ExportRecord
    path: Path

    @property
    def schedule(self) -> SkipSchedule:
        """The schedule from ``skip_schedule.json``, checked against the model's layer count."""
        return self.record.schedule

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.schedule, self.tokenizer))


def load_exported(
    path: str | os.PathLike, attn_implementation: str = "sdpa", dtype: torch.dtype | None = None
) -> ExportedModel:
    """Load an export for skip-aware inference.

    The export is verified (:func:`verify_export`, as when it was written) before any weights are loaded.

    Args:
        path: The export directory (merged weights, or an adapter-only export whose base model is loadable), or
            the Hub repository id of an export, fetched through huggingface_hub's cache (:func:`hub_export`).
        attn_implementation: ``sdpa`` or ``eager``.
        dtype: Weight dtype (default float32).

    Raises:
        ExportError: for any defect :func:`verify_export` refuses, or adapter tensors that do not fit the base.
        ModelError: for a Hub id that cannot be fetched (:func:`hub_export`).
    """
    from transformers import AutoTokenizer

    directory = hub_export(path, required=True) or Path(path)
    record = verify_export(directory)
    if is_adapter_export(directory):
        quantization = Quantization.from_hparams(record.base_quantization)
        base = load_causal_lm(record.base_model, attn_implementation=attn_implementation, dtype=dtype,
                              quantization_config=quantization and quantization.config())
        adapted = PeftModel.from_pretrained(base, str(directory))
        check_exported_adapter(directory, adapted)
        model = merged_model(adapted, in_place=True).to(dtype or torch.float32)
    else:
        model = load_causal_lm(str(directory), attn_implementation=attn_implementation, dtype=dtype)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(directory)))
    return ExportedModel(model.eval(), tokenizer, record, directory)
