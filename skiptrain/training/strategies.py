"""Scale-out strategies: FSDP and DeepSpeed ZeRO for skip-aware models of any supported family.

Plain DDP needs nothing special (Lightning's ``DDPStrategy`` with ``find_unused_parameters=False`` works, because
the skip-aware forward calls every decoder layer on every step, see :mod:`skiptrain.modeling.forward`). Sharded
strategies need two things Lightning's stock classes cannot know:

- :class:`SkipFSDPStrategy` wraps every *decoder layer* in its own FSDP unit. The layer class depends on the
  family (``LlamaDecoderLayer``, ``OPTDecoderLayer``, ``GPT2Block``, ...) and is only known once
  ``configure_model`` has loaded the model, so the wrap policy is built at setup from
  :func:`skiptrain.modeling.architectures.decoder_parts`.
- :class:`SkipDeepSpeedStrategy` makes ``transformers`` load weights straight into ZeRO-3 partitions (each rank
  holds 1/N of every weight from the start; without it ``from_pretrained`` would write full weights into empty
  partitioned placeholders) and, with optimizer offload, steps DeepSpeed's vectorised CPU Adam.

Activation checkpointing is the model's own flag, ``model.activation_checkpointing: true`` (transformers'
non-reentrant checkpointing of each decoder layer), under every strategy; the strategies here do not add a second
checkpoint wrapper.

:func:`release_process_group` ends the process group when the process exits, so that multi-process CPU (gloo)
runs exit cleanly; :class:`~skiptrain.training.module.SkipLM` registers it in ``setup``.
"""

from __future__ import annotations

import atexit
import dataclasses
from collections.abc import Generator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Literal

import torch
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, Strategy
from torch import nn
from transformers import PreTrainedModel

from skiptrain.errors import UsageError
from skiptrain.modeling.architectures import decoder_parts

__all__ = [
    "ClippingFSDPPrecision",
    "SkipDeepSpeedStrategy",
    "SkipFSDPStrategy",
    "decoder_layer_classes",
    "release_process_group",
]


def decoder_layer_classes(module: nn.Module) -> set[type[nn.Module]]:
    """The decoder layer class(es) of the first Hugging Face model inside ``module``.

    Args:
        module: A :class:`~skiptrain.training.module.SkipLM`, a peft model or a plain ``transformers`` causal LM.

    Raises:
        ValueError: if ``module`` holds no Hugging Face model, or its family is unsupported.
    """
    for sub in module.modules():  # pre-order: the outer *ForCausalLM comes before its decoder body
        if isinstance(sub, PreTrainedModel):
            return {type(layer) for layer in decoder_parts(sub).layers}
    raise ValueError(
        f"{type(module).__name__} holds no Hugging Face PreTrainedModel: cannot find its decoder layers to wrap "
        "(create the model in configure_model before the strategy sets it up)"
    )


_RELEASE_REGISTERED = False


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def release_process_group() -> None:
    """Destroy the default process group when the process exits (registered once; a no-op without one).

    Lightning leaves the process group alive after ``fit`` so that ``validate``/``test`` in the same process can
    reuse it. Left to the interpreter's own shutdown, a gloo group is torn down during finalisation, which now
    and then aborts the process after a successful run. An ``atexit`` handler runs before that, while every
    object is still alive, and does not break a later ``trainer.test()`` in the same script.
    """
    global _RELEASE_REGISTERED
    if not _RELEASE_REGISTERED:
        atexit.register(_destroy_process_group)
        _RELEASE_REGISTERED = True


class ClippingFSDPPrecision(FSDPPrecision):
    """Lightning's ``FSDPPrecision`` plus gradient-norm clipping over all shards (``trainer.gradient_clip_val``).

    Lightning's refuses norm clipping because the plugin has no reference to the root FSDP module, whose
    ``clip_grad_norm_`` computes the norm over every rank's shard; :class:`SkipFSDPStrategy` sets ``root``.
    """

    root: nn.Module | None = None

    def clip_grad_by_norm(self, optimizer: torch.optim.Optimizer, clip_val: float) -> None:
        if self.root is None:
            super().clip_grad_by_norm(optimizer, clip_val)  # raises: no root module to clip over
        self.root.clip_grad_norm_(clip_val)


class SkipFSDPStrategy(FSDPStrategy):
    """Fully sharded data parallel with one FSDP unit per decoder layer, for every supported model family.

    Args:
        sharding_strategy: ``FULL_SHARD`` (parameters, gradients and optimizer state sharded: ZeRO-3-like),
            ``SHARD_GRAD_OP`` (ZeRO-2-like), ``HYBRID_SHARD`` (full shard within a node, replicated across nodes)
            or ``NO_SHARD`` (DDP).
        state_dict_type: ``sharded``: every rank writes its own shard of a checkpoint directory (fast, no gather;
            consolidate with :func:`skiptrain.training.checkpoints.consolidate_checkpoint`); ``full``: rank 0
            gathers one ordinary checkpoint file.
        cpu_offload: Keep sharded parameters (and gradients) on the CPU between uses.
        limit_all_gathers: Rate-limit all-gathers so prefetching cannot run out of GPU memory.
        backward_prefetch: ``BACKWARD_PRE`` (prefetch the next unit's weights before the current backward,
            faster) or ``BACKWARD_POST``.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on CPUs; ``None`` picks from the device.
        timeout_minutes: Collective timeout.

    The wrap policy is ``ModuleWrapPolicy`` over the model's decoder layer class, found after ``configure_model``
    by :func:`decoder_layer_classes`; the embeddings, final norm and LM head (tied or not) stay in the root unit.
    Every decoder layer is called on every step by the skip-aware forward, so every rank gathers the same units
    in the same order. Two differences from Lightning's ``FSDPStrategy``: ``trainer.gradient_clip_val`` clips the
    global gradient norm (:class:`ClippingFSDPPrecision`), and with ``*-mixed`` precision buffers stay in fp32
    (Lightning casts them to bf16/fp16, which rounds the rotary-embedding frequencies ``inv_freq`` and shifts
    positions; the exported model computes them in fp32).
    """

    def __init__(
        self,
        sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "sharded",
        cpu_offload: bool = False,
        limit_all_gathers: bool = True,
        backward_prefetch: Literal["BACKWARD_PRE", "BACKWARD_POST"] = "BACKWARD_PRE",
        process_group_backend: str | None = None,
        timeout_minutes: int = 30,
    ) -> None:
        from torch.distributed.fsdp import BackwardPrefetch

        super().__init__(
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            cpu_offload=cpu_offload,
            limit_all_gathers=limit_all_gathers,
            backward_prefetch=BackwardPrefetch[backward_prefetch],
            process_group_backend=process_group_backend,
            timeout=timedelta(minutes=timeout_minutes),
        )

    @property
    def precision_plugin(self) -> FSDPPrecision:
        return FSDPStrategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin: FSDPPrecision | None) -> None:
        if plugin is not None and type(plugin) is FSDPPrecision:
            plugin = ClippingFSDPPrecision(plugin.precision, plugin.scaler)
        FSDPStrategy.precision_plugin.fset(self, plugin)

    @property
    def mixed_precision_config(self) -> Any:
        config = super().mixed_precision_config
        if config is not None and "mixed" in self.precision_plugin.precision:
            config = dataclasses.replace(config, buffer_dtype=torch.float32)
        return config

    def _setup_model(self, model: nn.Module) -> nn.Module:
        """Wrap the root module and every decoder layer, on the strategy's device (a GPU, or the CPU)."""
        from lightning.pytorch.strategies.fsdp import _move_torchmetrics_to_device
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)  # wrapped by the user: Lightning's handling
        # Lightning passes ``root_device.index``, which is None on a CPU and makes FSDP look for a GPU; the device
        # itself works everywhere (``cuda:N`` is the same as ``N``).
        model = FullyShardedDataParallel(
            module=model,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,
            auto_wrap_policy=ModuleWrapPolicy(decoder_layer_classes(model)),
            **self.kwargs,
        )
        _move_torchmetrics_to_device(model, self.root_device)
        if isinstance(self.precision_plugin, ClippingFSDPPrecision):
            self.precision_plugin.root = model
        return model


class SkipDeepSpeedStrategy(DeepSpeedStrategy):
    """DeepSpeed ZeRO stage 2 or 3 for Hugging Face models created in ``configure_model``.

    Args:
        stage: ZeRO stage: 2 shards optimizer state and gradients, 3 also the parameters.
        offload_optimizer: Keep optimizer state in CPU memory and step it there.
        offload_parameters: Keep ZeRO-3 parameter partitions in CPU memory (stage 3 only).
        cpu_adam: With ``offload_optimizer``, step with DeepSpeed's vectorised ``DeepSpeedCPUAdam`` (same AdamW
            hyperparameters and learning-rate schedule; JIT-compiled with the system C++ compiler on first use).
            ``False`` keeps torch's AdamW on the CPU (no compilation, several times slower per step).
        pin_memory: Pin offloaded CPU buffers (faster host-device copies, more locked host memory).
        allgather_bucket_size: Elements per all-gather bucket.
        reduce_bucket_size: Elements per reduce-scatter bucket.
        overlap_comm: Overlap gradient reduction with the backward pass.
        exclude_frozen_parameters: Leave frozen (LoRA base) weights out of checkpoints; the export then needs the
            base model to rebuild them, so the default keeps them.
        config: A full DeepSpeed config (dict or JSON path) replacing everything above except ``cpu_adam``.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on CPUs; ``None`` picks from the device.
        timeout_minutes: Collective timeout.

    Precision (``trainer.precision: bf16-mixed``), gradient clipping and accumulation come from the Trainer as
    with Lightning's ``DeepSpeedStrategy``. Checkpoints are directories of per-rank shards; consolidate them with
    :func:`skiptrain.training.checkpoints.consolidate_checkpoint`.
    """

    def __init__(
        self,
        stage: Literal[2, 3] = 2,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        cpu_adam: bool = True,
        pin_memory: bool = True,
        allgather_bucket_size: int = 200_000_000,
        reduce_bucket_size: int = 200_000_000,
        overlap_comm: bool = True,
        exclude_frozen_parameters: bool = False,
        config: str | dict[str, Any] | None = None,
        process_group_backend: str | None = None,
        timeout_minutes: int = 30,
    ) -> None:
        if stage not in (2, 3):
            raise UsageError(f"stage={stage} is invalid: allowed 2 or 3")
        if offload_parameters and stage != 3:
            raise UsageError(f"offload_parameters=True is invalid with stage={stage}: parameter offload needs stage 3")
        super().__init__(
            stage=stage,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            pin_memory=pin_memory,
            allgather_bucket_size=allgather_bucket_size,
            reduce_bucket_size=reduce_bucket_size,
            overlap_comm=overlap_comm,
            exclude_frozen_parameters=exclude_frozen_parameters,
            config=config,
            process_group_backend=process_group_backend,
            timeout=timedelta(minutes=timeout_minutes),
        )
        self.cpu_adam = cpu_adam
        if self.offloads_optimizer and not cpu_adam:
            self.config["zero_force_ds_cpu_optimizer"] = False  # allow torch's AdamW on offloaded state

    @property
    def offloads_optimizer(self) -> bool:
        """Whether the optimizer state lives on the CPU (ZeRO-Offload)."""
        offload = (self.config or {}).get("zero_optimization", {}).get("offload_optimizer") or {}
        return offload.get("device", "none") not in ("none", None)

    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        """Under ZeRO-3, let ``from_pretrained`` see the DeepSpeed config while ``configure_model`` runs.

        ``transformers`` then creates the model inside its own ``deepspeed.zero.Init`` (keeping rotary-embedding
        buffers in fp32) and loads each checkpoint tensor into its partitions. Modules created afterwards (LoRA
        adapters) are partitioned by ``deepspeed.initialize``.
        """
        if not self.zero_stage_3:
            yield
            return
        from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

        self._init_config_if_needed()
        hf_config = HfDeepSpeedConfig(self.config)  # transformers keeps only a weak reference: hold it here
        try:
            yield
        finally:
            unset_hf_deepspeed_config()
            del hf_config

    def _init_optimizers(self) -> tuple[torch.optim.Optimizer, Any]:
        optimizer, scheduler_config = super()._init_optimizers()
        if self.offloads_optimizer and self.cpu_adam and isinstance(optimizer, torch.optim.AdamW):
            optimizer = _as_cpu_adam(optimizer, scheduler_config)
        return optimizer, scheduler_config


def _as_cpu_adam(optimizer: torch.optim.AdamW, scheduler_config: Any) -> torch.optim.Optimizer:
    """The same AdamW (parameter groups, hyperparameters, learning-rate schedule) as ``DeepSpeedCPUAdam``."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    defaults = optimizer.defaults
    cpu_adam = DeepSpeedCPUAdam(
        optimizer.param_groups,  # the groups keep their own lr/betas/weight_decay (and the scheduler's initial_lr)
        lr=defaults["lr"],
        betas=defaults["betas"],
        eps=defaults["eps"],
        weight_decay=defaults["weight_decay"],
        adamw_mode=True,
    )
    if scheduler_config is not None:
        scheduler_config.scheduler.optimizer = cpu_adam  # LambdaLR reads and writes optimizer.param_groups
    return cpu_adam


def check_quantization_strategy(strategy: Strategy) -> None:
    """Refuse a strategy that shards or partitions parameters under ``model.quantization`` (QLoRA): skiptrain's 4-bit
    base runs on a single device or under DDP.

    Raises:
        UsageError: for FSDP and DeepSpeed.
    """
    if isinstance(strategy, FSDPStrategy | DeepSpeedStrategy):
        raise UsageError(f"model.quantization is not supported with trainer.strategy={type(strategy).__name__}: "
                         "its 4-bit base weights are not sharded (FSDP) or partitioned (DeepSpeed) here; allowed a "
                         "single device or ddp")

