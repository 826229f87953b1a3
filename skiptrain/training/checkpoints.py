"""Consolidate Lightning checkpoints, sharded or not, into one full state dict on the CPU.

Three layouts reach an export:

- a single file (``*.ckpt``): DDP, one device, or FSDP with ``state_dict_type: full``;
- a DeepSpeed ZeRO-2/3 directory (``latest``, ``checkpoint/*_model_states.pt``, ``*_optim_states.pt``): the fp32
  master weights are reassembled from the per-rank optimizer partitions by DeepSpeed's own
  ``get_fp32_state_dict_from_zero_checkpoint``; frozen weights (a LoRA base) come from the model-state files;
- an FSDP sharded directory (``.metadata``, ``*.distcp``, ``meta.pt``), written by ``torch.distributed.checkpoint``:
  its ``model`` entry is read back as full tensors without a process group (optimizer state is not read).

Lightning's own consolidations are not called, as neither fits an in-memory read of the weights:
``lightning.fabric.utilities.load._load_distributed_checkpoint`` (behind ``consolidate_checkpoint``) reads the FSDP
optimizer states too, three times the memory of the weights, and
``lightning.pytorch.utilities.deepspeed.convert_zero_checkpoint_to_fp32_state_dict`` writes a file and reads an
optimizer partition; both end in the DeepSpeed and ``torch.distributed.checkpoint`` readers used here.

Known ways a consolidation goes wrong are refused, never passed on: zero-element placeholders (what a ZeRO-3
module holds outside ``GatheredParameters``, and what ``model_states.pt`` stores for every partitioned weight),
missing keys and wrong shapes. A missing tied weight (``lm_head.weight`` sharing the input embedding) is restored
from its partner when a ``reference`` module shows the tie.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from skiptrain.core.key_diff import diff_keys, list_names
from skiptrain.errors import InputError, UsageError

__all__ = [
    "CheckpointError",
    "checkpoint_layout",
    "checkpoint_metadata",
    "consolidate_checkpoint",
    "resolve_ckpt_path",
]

Layout = Literal["file", "deepspeed", "fsdp_sharded"]
FSDP_METADATA_FILE = "meta.pt"  # Lightning's FSDPStrategy: everything but the model and optimizer states
_WRAPPER_PREFIXES = ("_forward_module.",)  # Lightning < 2.1 wrapped the LightningModule under this name
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


class CheckpointError(InputError):
    """A checkpoint that cannot be read, or whose consolidated weights are incomplete or placeholders."""


def checkpoint_layout(path: str | os.PathLike) -> Layout:
    """Which of the three layouts ``path`` is.

    Raises:
        CheckpointError: for a missing path or a directory that is neither a DeepSpeed nor an FSDP checkpoint.
    """
    path = Path(path)
    if path.is_file():
        return "file"
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r}: no such file or directory")
    if (path / "latest").is_file() or any(path.glob("*/*model_states.pt")):
        return "deepspeed"
    if (path / ".metadata").is_file():
        return "fsdp_sharded"
    raise CheckpointError(
        f"checkpoint directory {str(path)!r} is neither a DeepSpeed ZeRO checkpoint (a 'latest' file and "
        "<tag>/*model_states.pt) nor a torch.distributed.checkpoint (FSDP) directory (a '.metadata' file)"
    )


LAST = "last"
"""``--ckpt_path last``: the newest ``last*.ckpt`` of the run's directory (``trainer.default_root_dir``)."""
LIGHTNING_ONLY = ("best", "hpc", "registry")
"""Lightning's other ``ckpt_path`` keywords, which need a live trainer or a cluster or model registry."""


def resolve_ckpt_path(ckpt_path: str, root: str | os.PathLike) -> str:
    """``ckpt_path`` as a path: ``last`` becomes the newest ``last*.ckpt`` under ``root``; other paths are kept.

    Raises:
        UsageError: for Lightning's ``best``, ``hpc`` and ``registry`` keywords and URLs, which skiptrain does not
            resolve.
        CheckpointError: for ``last`` when ``root`` holds no ``last*.ckpt``.
    """
    if ckpt_path in LIGHTNING_ONLY or "://" in ckpt_path:
        raise UsageError(f"ckpt_path={ckpt_path!r} is not supported: allowed the path of a checkpoint (a file or a "
                         f"sharded checkpoint directory) or {LAST!r} (the newest last.ckpt under "
                         "trainer.default_root_dir)")
    if ckpt_path != LAST or Path(ckpt_path).exists():
        return ckpt_path
    found = sorted(Path(root).rglob("last*.ckpt"), key=lambda path: path.stat().st_mtime)
    if not found:
        raise CheckpointError(f"ckpt_path='last': no last.ckpt under trainer.default_root_dir={str(root)!r}: give "
                              "the path of a checkpoint, or set trainer.default_root_dir to the run's directory")
    rank_zero_info(f"skiptrain: ckpt_path='last' is {found[-1]}")
    return str(found[-1])


def consolidate_checkpoint(
    path: str | os.PathLike,
    reference: nn.Module | None = None,
    prefix: str = "",
    weights_only: bool | None = None,
) -> dict[str, torch.Tensor]:
    """The full, unsharded state dict saved in a Lightning checkpoint file or sharded checkpoint directory.

    Args:
        path: A ``*.ckpt`` file, a DeepSpeed ZeRO-2/3 checkpoint directory, or an FSDP sharded checkpoint
            directory (what ``ModelCheckpoint`` writes under each strategy).
        reference: A module with the architecture the weights belong to (e.g. a
            :class:`~skiptrain.training.module.SkipLM` after ``configure_model``, or its ``.model`` with
            ``prefix="model."``). When given, the result is checked against its state dict: tied weights missing
            from the checkpoint are restored from their partner, and any other missing, unexpected or mis-shaped key
            raises.
        prefix: Keep only keys starting with this (e.g. ``"model."`` for the Hugging Face / peft model inside a
            ``SkipLM``) and strip it. ``""`` keeps the LightningModule's own keys.
        weights_only: For single files, as ``torch.load``'s: ``None``/``True`` unpickle tensors and plain data
            only, ``False`` any object (trusted checkpoints only). DeepSpeed's reader always unpickles fully;
            FSDP shards are read by ``torch.distributed.checkpoint``.

    Returns:
        Name -> full CPU tensor, keys as ``LightningModule.state_dict()`` (wrapper prefixes removed), then
        ``prefix`` stripped. DeepSpeed gives the fp32 master weights; other layouts keep the saved dtype.

    Raises:
        CheckpointError: for an unreadable path, zero-element placeholder tensors, or (with ``reference``) missing,
            unexpected or mis-shaped keys; every message names the keys.
    """
    layout = checkpoint_layout(path)
    if layout == "file":
        state = _load_file(path, weights_only)["state_dict"]
    elif layout == "deepspeed":
        state = _deepspeed_state_dict(Path(path))
    else:
        state = _fsdp_sharded_state_dict(Path(path))
    state = {_clean_key(k): v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if prefix:
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    _refuse_placeholders(state, path)
    if reference is not None:
        state = _check_against(state, reference, path)
    return state


def checkpoint_metadata(path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
    """Everything but weights and optimizer states (hyper-parameters, epoch, loops, callbacks) of any layout.

    Args:
        path: As :func:`consolidate_checkpoint`.
        weights_only: As :func:`consolidate_checkpoint`, for single files and FSDP's ``meta.pt`` (DeepSpeed
            model-state files are always fully unpickled).
    """
    path = Path(path)
    layout = checkpoint_layout(path)
    if layout == "file":
        checkpoint = _load_file(path, weights_only)
    elif layout == "fsdp_sharded":
        checkpoint = torch.load(path / FSDP_METADATA_FILE, map_location="cpu", weights_only=weights_only is not False)
    else:
        files = sorted(_deepspeed_tag_dir(path).glob("*model_states.pt"))
        if not files:
            raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} has no *model_states.pt file")
        checkpoint = torch.load(files[0], map_location="cpu", weights_only=False)
        deepspeed_keys = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
                          "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
                          "sparse_tensor_module_names", "csr_tensor_module_names", "skipped_steps", "global_steps",
                          "global_samples", "dp_world_size", "mp_world_size", "checkpoint_parallel_dimensions",
                          "ds_config", "ds_version"}
        checkpoint = {k: v for k, v in checkpoint.items() if k not in deepspeed_keys}
    return {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states", "lr_schedulers")}


# -- layouts ---------------------------------------------------------------------------------------------------------
def _load_file(path: str | os.PathLike, weights_only: bool | None) -> Mapping[str, Any]:
    """A single-file Lightning checkpoint on the CPU (memory-mapped: tensors are read when used)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=weights_only is not False)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds Python objects besides tensors and plain data, which are not unpickled "
            f"by default; if you trust the file, pass weights_only=False (--weights_only false). {err}"
        ) from err
    except (RuntimeError, EOFError) as err:  # torch's zip reader: a truncated or foreign file
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be read: it is truncated or not a torch checkpoint "
            f"({str(err).splitlines()[0].split('. ')[0]}); use an intact one, e.g. the run's previous checkpoint"
        ) from err
    if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint:
        raise CheckpointError(f"checkpoint {str(path)!r} is not a Lightning checkpoint: it has no 'state_dict'")
    return checkpoint


def _deepspeed_tag_dir(path: Path) -> Path:
    latest = path / "latest"
    tag = latest.read_text().strip() if latest.is_file() else None
    if tag is None:
        tags = sorted({p.parent.name for p in path.glob("*/*model_states.pt")})
        if len(tags) != 1:
            raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} has no 'latest' file and tags {tags}")
        tag = tags[0]
    return path / tag


def _deepspeed_state_dict(path: Path) -> dict[str, torch.Tensor]:
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as err:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is a DeepSpeed ZeRO directory; reading it needs DeepSpeed: "
            "pip install 'skiptrain[deepspeed]'"
        ) from err
    tag = _deepspeed_tag_dir(path).name
    return get_fp32_state_dict_from_zero_checkpoint(str(path), tag=tag)


def _fsdp_sharded_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The ``model`` entry of a ``torch.distributed.checkpoint`` directory as full tensors, in this process only."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    # What torch.distributed.checkpoint.format_utils.dcp_to_torch_save does, restricted to the model weights
    # (the optimizer states, twice the model's size, are not read).
    loaded: dict[str, Any] = {}
    _load_state_dict(
        loaded, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(keys={"model"}), no_dist=True
    )
    if "model" not in loaded:
        raise CheckpointError(f"FSDP checkpoint {str(path)!r} has no 'model' entry: keys {sorted(loaded)}")
    return loaded["model"]


# -- checks ----------------------------------------------------------------------------------------------------------
def _clean_key(key: str) -> str:
    for wrapper in _WRAPPER_PREFIXES:
        if key.startswith(wrapper):
            key = key[len(wrapper):]
    for segment in _WRAPPER_SEGMENTS:
        key = key.replace(segment, "")
    return key


def _refuse_placeholders(state: Mapping[str, torch.Tensor], path: str | os.PathLike) -> None:
    empty = sorted(k for k, v in state.items() if v.numel() == 0)
    if empty:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {len(empty)} zero-element tensors, i.e. ZeRO-3/FSDP partition placeholders "
            f"saved without gathering: {list_names(empty)}. Consolidate the sharded checkpoint directory itself, not a "
            "state_dict() taken from a sharded module"
        )
    if not state:
        raise CheckpointError(f"checkpoint {str(path)!r} holds no tensors (wrong prefix?)")


def _tied_groups(reference: nn.Module) -> list[list[str]]:
    """State-dict names that share one parameter (e.g. ``lm_head.weight`` and the input embedding)."""
    groups: dict[int, list[str]] = {}
    for name, param in reference.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _check_against(
    state: dict[str, torch.Tensor], reference: nn.Module, path: str | os.PathLike
) -> dict[str, torch.Tensor]:
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    restored = []
    for names in _tied_groups(reference):
        present = [n for n in names if n in state]
        for name in names:
            if name not in state and present and name in expected:
                state[name] = state[present[0]]
                restored.append(f"{name} <- {present[0]}")
    if restored:
        rank_zero_info(f"skiptrain: restored tied weights missing from {path}: {', '.join(restored)}")
    problems = diff_keys({k: v.shape for k, v in state.items()}, expected).problems()
    if problems:
        raise CheckpointError(f"checkpoint {str(path)!r} does not match {type(reference).__name__}: "
                              + "; ".join(problems))
    return state

