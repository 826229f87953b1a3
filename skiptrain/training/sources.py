"""Weights sources: what a model name or path given for weights is, and how to load it, decided in one place.

``model.model``, ``model.init_from`` and a distillation teacher each name a :class:`WeightsSource` of one of three
kinds:

- ``pretrained``: a hub id, a local Hugging Face directory, a ``.gguf`` file or a bundled short name
  (:func:`~skiptrain.modeling.loading.resolve_model` says where ``from_pretrained`` looks);
- ``export``: an export directory (``skiptrain export``) or the Hub id of one, which brings its weights, schedule and
  tokenizer;
- ``checkpoint``: a checkpoint of a fit run, a ``.ckpt`` file or a sharded DeepSpeed/FSDP directory.

:func:`resolve_weights_source` tells them apart; :func:`load_trained_model` loads the causal LM of an earlier run (an
export or a checkpoint) as a plain transformers model, without building a LightningModule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from skiptrain.core.schedules import SkipSchedule
from skiptrain.errors import UsageError
from skiptrain.export.format import is_export, schedule_from_export
from skiptrain.export.hub import hub_export
from skiptrain.export.load import ExportedModel, load_exported
from skiptrain.export.write import merged_model
from skiptrain.modeling.loading import load_causal_lm
from skiptrain.modeling.quantization import Quantization, is_under, quantized_weight_names
from skiptrain.training.checkpoints import (
    CheckpointError,
    checkpoint_layout,
    checkpoint_metadata,
    consolidate_checkpoint,
)
from skiptrain.training.lora import with_adapters
from skiptrain.training.settings import upgrade_hparams

WeightsKind = Literal["pretrained", "export", "checkpoint"]


@dataclass(frozen=True)
class WeightsSource:
    """Where weights come from: a name or path as given, and which kind of source it is (not to be confused with
    :class:`~skiptrain.modeling.loading.ModelSource`, where ``from_pretrained`` looks for a pretrained one)."""

    name: str
    kind: WeightsKind

    def schedule(self) -> SkipSchedule | None:
        """The schedule an export brings (read from its ``skip_schedule.json``), or ``None`` for other kinds."""
        return schedule_from_export(self.name)[0] if self.kind == "export" else None

    def load_export(self, attn_implementation: str = "sdpa", dtype: torch.dtype | None = None) -> ExportedModel:
        """The export, verified and loaded (:func:`~skiptrain.export.load.load_exported`) in ``dtype``."""
        return load_exported(self.name, attn_implementation=attn_implementation, dtype=dtype)


def resolve_weights_source(name: str | os.PathLike) -> WeightsSource:
    """What ``name`` is: an export directory, a checkpoint of a fit run, or else a pretrained model.

    Nothing is loaded; a pretrained name that cannot be found is refused when it is loaded, with its own message.
    The Hub id of an export is an export: its local copy in huggingface_hub's cache (:func:`hub_export`).
    """
    downloaded = hub_export(name)
    if downloaded is not None:
        return WeightsSource(str(downloaded), "export")
    path = Path(name)
    if is_export(path):
        return WeightsSource(str(name), "export")
    if path.is_file() and path.suffix.lower() != ".gguf":
        return WeightsSource(str(name), "checkpoint")
    if path.is_dir() and not (path / "config.json").is_file():
        try:
            checkpoint_layout(path)
            return WeightsSource(str(name), "checkpoint")
        except CheckpointError:
            pass  # a directory from_pretrained may still read; its loader names what is missing
    return WeightsSource(str(name), "pretrained")


def load_trained_model(source: WeightsSource, attn_implementation: str = "sdpa") -> nn.Module:
    """The causal LM of an earlier run (an export or a checkpoint), LoRA merged, on the CPU in float32.

    A checkpoint's model is rebuilt from its stored hyper-parameters (``model`` and ``lora``) and given the
    checkpoint's weights; the earlier run's own warm start and teacher do not matter, as its weights hold them.

    Raises:
        CheckpointError: for a pretrained source, or a checkpoint without skiptrain hyper-parameters.
        ExportError: for an unusable export.
    """
    if source.kind == "export":
        return source.load_export(attn_implementation).model  # merged weights, or the adapter merged on load
    if source.kind != "checkpoint":
        raise CheckpointError(f"{source.name!r} is neither a checkpoint of a fit run (a .ckpt file or a sharded "
                              "DeepSpeed/FSDP directory) nor an export directory")
    hparams = upgrade_hparams(checkpoint_metadata(source.name).get("hyper_parameters") or {})
    if "model" not in hparams or "schedule" not in hparams:
        raise CheckpointError(f"checkpoint {source.name!r} has no SkipLM hyper-parameters (model, schedule)")
    quantization = Quantization.from_hparams(hparams.get("quantization"))
    model = load_causal_lm(str(hparams["model"]), attn_implementation=attn_implementation,
                           quantization_config=quantization and quantization.config())
    lora = hparams.get("lora")
    if lora is not None:
        model = with_adapters(model, lora)
    if quantization is None:
        model.load_state_dict(consolidate_checkpoint(source.name, reference=model, prefix="model."))
    else:
        _load_without_quantized_weights(model, consolidate_checkpoint(source.name, prefix="model."), source.name)
    return merged_model(model, in_place=True)


def _load_without_quantized_weights(model: nn.Module, state: dict, name: str) -> None:
    """Load a QLoRA checkpoint's tensors into ``model``: all but its 4-bit base weights, which checkpoints leave out
    (the base was quantized again, identically, as it loaded)."""
    result = model.load_state_dict(state, strict=False)
    frozen = quantized_weight_names(model)
    missing = [k for k in result.missing_keys if not is_under(k, frozen)]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"checkpoint {name!r} does not fit its model: missing {missing}, unexpected "
                              f"{result.unexpected_keys}")


def load_run_weights(model: nn.Module, source: WeightsSource) -> None:
    """Copy the weights of an earlier run (see :func:`load_trained_model`) into ``model``, which must match them.

    Raises:
        CheckpointError: when a tensor name or shape of the earlier run differs from ``model``'s.
    """
    trained = load_trained_model(source, attn_implementation=getattr(model.config, "_attn_implementation", "sdpa"))
    try:
        model.load_state_dict(trained.state_dict())
    except RuntimeError as err:  # missing, unexpected or mis-shaped tensors, each named by torch
        raise CheckpointError(f"init_from={source.name!r} does not fit the model: {err}") from err


def earlier_run(field: str, path: str) -> WeightsSource:
    """``path`` resolved as an earlier run (a checkpoint or an export); anything else is refused, naming ``field``."""
    source = resolve_weights_source(path)
    if not Path(path).exists() or source.kind == "pretrained":
        raise UsageError(f"{field}={path!r} is invalid: allowed the path of an existing checkpoint or export")
    return source
