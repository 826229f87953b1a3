"""Test-only helpers for multi-process CPU runs: DeepSpeed over gloo, and a per-rank recorder callback.

Lightning's ``DeepSpeedStrategy`` refuses any accelerator but CUDA; DeepSpeed itself runs on CPU
(``deepspeed.accelerator`` falls back to its CPU accelerator, communicating over gloo). :class:`CPUDeepSpeedStrategy`
lifts only Lightning's CUDA assumptions (the accelerator check, device-index validation, and ``root_device.index``
as DeepSpeed's device rank), so the CPU tests run the product strategy's code paths (ZeRO-3 loading through
transformers, optimizer swap for offload, sharded checkpoints).

FSDP needs no subclass: Lightning refuses only its own ``FSDPStrategy`` class on CPU, and
:class:`skiptrain.training.strategies.SkipFSDPStrategy` passes FSDP the device itself, which works on a CPU.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from skiptrain.training.strategies import SkipDeepSpeedStrategy


class CPUDeepSpeedStrategy(SkipDeepSpeedStrategy):
    """:class:`~skiptrain.training.strategies.SkipDeepSpeedStrategy` on CPU processes (gloo); tests only."""

    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)  # skips DeepSpeedStrategy's "CUDA GPUs only" check

    def setup_distributed(self) -> None:
        reset_seed()  # as DeepSpeedStrategy, without validating CUDA device indices (CPU devices have none)
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model: nn.Module, optimizer: Any, lr_scheduler: Any = None) -> tuple:
        import deepspeed  # as DeepSpeedStrategy, with the local rank as device rank (a CPU device has no index)

        engine, deepspeed_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank),
            config=self.config,
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, deepspeed_optimizer


def model_layout(model: nn.Module) -> dict[str, Any]:
    """How a strategy holds the model: FSDP units by wrapped class, ZeRO-3 partition sizes."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    units = Counter(type(m.module).__name__ for m in model.modules() if isinstance(m, FullyShardedDataParallel))
    zero3 = [p for p in model.parameters() if hasattr(p, "ds_id")]
    return {
        "fsdp_units": dict(units),
        "zero3_params": len(zero3),
        "zero3_local_numel": sum(p.ds_tensor.numel() for p in zero3),
        "zero3_full_numel": sum(p.ds_numel for p in zero3),
    }


class RunRecorder(Callback):
    """Writes ``<path>/rank<r>.json``: losses, batch rows and learning rates in step order; model layout; optimizer.

    Args:
        path: Folder for the files (the run directory).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.record: dict[str, Any] = {"losses": [], "rows": [], "lrs": []}

    def on_train_start(self, trainer, pl_module) -> None:
        optimizer = trainer.optimizers[0]
        base = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed wraps the client optimizer
        self.record.update(layout=model_layout(trainer.strategy.model), optimizer=type(base).__name__,
                           world_size=trainer.world_size)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.record["losses"].append(float(outputs["loss"]))
        self.record["rows"].append(batch["input_ids"].tolist())
        self.record["lrs"].append(trainer.optimizers[0].param_groups[0]["lr"])  # what the next step will use

    def on_train_end(self, trainer, pl_module) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.record))
