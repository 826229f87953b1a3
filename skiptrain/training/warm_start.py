"""The weights of an earlier run as a plain transformers model: two-stage training and fixed distillation teachers.

An earlier run is a checkpoint of ``fit`` (a ``.ckpt`` file or a sharded DeepSpeed/FSDP directory) or an export
directory. Either way the result is the run's causal LM with any LoRA adapters merged, so the next run can add
adapters of its own on top, or use it frozen as a teacher.
"""

from __future__ import annotations

import os

from torch import nn

from skiptrain.training.checkpoints import CheckpointError, checkpoint_metadata


def trained_model(path: str | os.PathLike, attn_implementation: str = "sdpa") -> nn.Module:
    """The causal LM of an earlier run (checkpoint or export), LoRA merged, on the CPU in float32."""
    from lightning.pytorch.cli import instantiate_module

    from skiptrain.export.write import is_export
    from skiptrain.training.module import SkipLM, accept_schedule_families
    from skiptrain.training.runs import load_weights

    if is_export(path):
        module = SkipLM(model=str(path), attn_implementation=attn_implementation)
        load_weights(module, ckpt_path=None)
        return module.model  # exports hold merged weights, or load_exported merges the adapter
    hparams = dict(checkpoint_metadata(path).get("hyper_parameters") or {})
    if "model" not in hparams or "schedule" not in hparams:
        raise CheckpointError(f"checkpoint {str(path)!r} has no SkipLM hyper-parameters (model, schedule)")
    # Only the architecture and the weights matter here: the earlier run's own warm start and teacher are not loaded.
    hparams.update(init_from=None, distillation=None, attn_implementation=attn_implementation)
    if hparams.pop("_instantiator", None) is not None:  # saved by LightningCLI: configs, not objects
        accept_schedule_families()
        module = instantiate_module(SkipLM, hparams)
    else:
        module = SkipLM(**hparams)
    load_weights(module, ckpt_path=str(path))
    model = module.model
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def load_run_weights(model: nn.Module, path: str | os.PathLike) -> None:
    """Copy the weights of an earlier run (see :func:`trained_model`) into ``model``, which must match its layout.

    Raises:
        CheckpointError: when a tensor name or shape of the earlier run differs from ``model``'s.
    """
    source = trained_model(path, attn_implementation=getattr(model.config, "_attn_implementation", "sdpa"))
    try:
        model.load_state_dict(source.state_dict())
    except RuntimeError as err:  # missing, unexpected or mis-shaped tensors, each named by torch
        raise CheckpointError(f"init_from={str(path)!r} does not fit the model: {err}") from err
