"""The LightningModule: fine-tune a Hugging Face causal LM with its skip schedule in the forward pass."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Literal

import lightning as L
import torch
from jsonargparse import set_parsing_settings
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from peft import PeftModel, prepare_model_for_kbit_training
from transformers import BitsAndBytesConfig, PretrainedConfig

from skiptrain.core.curriculum import anneal_from_dense
from skiptrain.core.schedules import Dense, ScheduleFamily, SkipSchedule
from skiptrain.errors import UsageError
from skiptrain.export.format import ExportUsageError
from skiptrain.export.record import ExportRecord
from skiptrain.export.verify import export_config
from skiptrain.modeling.architectures import decoder_parts, enable_activation_checkpointing
from skiptrain.modeling.generation import generate_under_schedule
from skiptrain.modeling.loading import load_causal_lm, load_config, load_tokenizer
from skiptrain.modeling.precision import WeightsDtype, weights_dtype
from skiptrain.modeling.quantization import Quantization, require_bitsandbytes, use_training_kernels
from skiptrain.text.batch import IGNORE_INDEX
from skiptrain.training.checkpoints import consolidate_checkpoint
from skiptrain.training.lora import check_targets, lora_fields, with_adapters
from skiptrain.training.losses import (
    distillation_kl,
    hidden_state_mse,
    mean_layers_per_target,
    target_cross_entropy,
    target_hidden,
    target_logits,
)
from skiptrain.training.metrics import EvaluationMetrics
from skiptrain.training.quantized_state import WithoutQuantizedBase
from skiptrain.training.settings import TEACHERS, Curriculum, Distillation, GenerationSettings, OptimizerSettings
from skiptrain.training.sources import earlier_run, load_run_weights, load_trained_model, resolve_weights_source
from skiptrain.training.strategies import check_quantization_strategy

__all__ = ["Curriculum", "Distillation", "GenerationSettings", "OptimizerSettings", "SkipLM",
           "accept_schedule_families"]


def accept_schedule_families() -> None:
    """Let jsonargparse configure ``schedule`` by ``class_path`` (``skiptrain.SkipDecode``, ...).

    Called by the CLI and before a checkpoint's hyper-parameters are parsed (:meth:`SkipLM.load_from_checkpoint`).
    """
    set_parsing_settings(subclasses_enabled=[ScheduleFamily])


class SkipLM(WithoutQuantizedBase, L.LightningModule):
    """A causal LM fine-tuned with a position-dependent layer-skip schedule applied in its forward pass.

    Args:
        model: Hugging Face hub id, local directory, ``.gguf`` file, or a bundled short name
            (``smollm2-135m-instruct``).
        schedule: The skip schedule family and parameters (``SkipDecode``, ``Ranked``, ``Hierarchical``,
            ``Static``, ``Dense``); the layer count comes from the loaded model. There is no default: required, except
            when ``model`` is an export directory, whose ``skip_schedule.json`` is used.
        lora: Fields of peft's ``LoraConfig`` (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``, which
            may be ``all-linear``, ``use_dora``, ``use_rslora``, ...; :func:`~skiptrain.training.lora.lora_fields`);
            ``null`` fine-tunes every weight.
        quantization: Store the frozen base weights in 4 or 8 bits with bitsandbytes and train LoRA adapters on
            them (QLoRA; needs ``lora`` and ``pip install 'skiptrain[qlora]'``); ``null`` keeps them in full precision.
        distillation: Distillation from a teacher at full depth; ``null`` disables it.
        dense_loss_weight: Weight of a second cross entropy computed on the dense path (all layers) of the same
            weights, added to the scheduled one so that one model serves both depths; 0 disables it.
        curriculum: Anneal the training schedule from dense to ``schedule``; ``null`` trains with ``schedule``
            from the first step.
        init_from: Checkpoint or export of an earlier run (e.g. dense fine-tuning) whose weights, LoRA merged,
            initialise ``model`` before this run's adapters are added: the second stage of two-stage training.
        optimizer: AdamW and its learning-rate schedule.
        activation_checkpointing: Recompute decoder layers in the backward pass (``use_reentrant=False``).
        attn_implementation: ``sdpa`` or ``eager``.
        generation: Generation metrics during validation/test.
        dtype: The dtype weights load in: ``auto`` derives it from the trainer's precision (bf16 under
            ``bf16-mixed`` with LoRA or ``bf16-true``, fp32 master weights for full fine-tuning under mixed precision
            and for ``32-true``), or ``float32``, ``bfloat16``, ``float16``.
    """

    def __init__(
        self,
        model: str,
        schedule: ScheduleFamily | None = None,
        lora: dict[str, Any] | None = None,
        quantization: Quantization | None = None,
        distillation: Distillation | None = None,
        dense_loss_weight: float = 0.0,
        curriculum: Curriculum | None = None,
        init_from: str | None = None,
        optimizer: OptimizerSettings | None = None,
        activation_checkpointing: bool = False,
        attn_implementation: Literal["sdpa", "eager"] = "sdpa",
        generation: GenerationSettings | None = None,
        dtype: WeightsDtype = "auto",
    ) -> None:
        super().__init__()
        if schedule is not None and not isinstance(schedule, ScheduleFamily):
            raise UsageError(f"schedule={schedule!r} is invalid: allowed a schedule family (SkipDecode, "
                             "Ranked, Hierarchical, Static, Dense), e.g. schedule=SkipDecode(min_layers=..., "
                             "max_layers=...)")
        if dense_loss_weight < 0:
            raise UsageError(f"dense_loss_weight={dense_loss_weight} is invalid: allowed >= 0")
        init_source = earlier_run("init_from", init_from) if init_from is not None else None
        teacher = distillation.teacher if distillation is not None else None
        teacher_source = earlier_run("distillation.teacher", teacher) if teacher not in (None, *TEACHERS) else None
        if distillation is not None and distillation.teacher == "base" and lora is None:
            raise UsageError("distillation.teacher='base' needs lora: the base model with adapters disabled is the "
                             "teacher; use teacher 'dense' or a checkpoint path for full fine-tuning")
        if quantization is not None:
            if lora is None:
                raise UsageError("model.quantization needs model.lora: quantized base weights are frozen, so only "
                                 "LoRA adapters can train on them; set model.lora, or model.quantization: null for "
                                 "full fine-tuning")
            require_bitsandbytes()
        self.save_hyperparameters()
        self.source = resolve_weights_source(model)
        self.model_name = self.source.name  # an export's Hub id becomes its local copy
        self._init_source = init_source
        self._teacher_source = teacher_source
        self.schedule_family = schedule
        self.lora = lora_fields(lora) if lora is not None else None
        self.optimizer_settings = optimizer if optimizer is not None else OptimizerSettings()
        self.quantization = quantization
        self.distillation = distillation
        self.curriculum = curriculum
        self.generation = generation if generation is not None else GenerationSettings()
        self.model: torch.nn.Module | None = None
        self._model_config: PretrainedConfig | None = None  # read by check_model
        self.schedule: SkipSchedule | None = None
        self.tokenizer = None
        self._teacher: tuple[torch.nn.Module, ...] = ()  # a frozen teacher run, kept out of state_dict and optimizer
        self._scored_schedule: SkipSchedule | None = None  # set only inside scored_under()
        self._step_started: float | None = None
        self.metrics = EvaluationMetrics()

    @classmethod
    def load_from_checkpoint(cls, *args: Any, **kwargs: Any) -> SkipLM:  # type: ignore[override]
        """As Lightning's, with schedule families accepted by ``class_path`` in the stored hyper-parameters."""
        accept_schedule_families()
        return super().load_from_checkpoint(*args, **kwargs)

    def setup(self, stage: str) -> None:
        """Refuse a quantized base under a sharding strategy; create the generation metrics (``auto`` asks the data
        module which its task uses)."""
        if self.quantization is not None and self._trainer is not None:
            check_quantization_strategy(self.trainer.strategy)
        metric = self.generation.metric
        if metric == "auto":
            datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
            metric = getattr(datamodule, "metric", None) or "none"
        self.metrics = EvaluationMetrics(metric)

    # -- model ---------------------------------------------------------------------------------------------------
    def _schedule_family(self) -> ScheduleFamily:
        if self.schedule_family is None:
            raise UsageError(f"model.schedule is required for model={self.model_name!r} (no default schedule): "
                             "allowed SkipDecode, Ranked, Hierarchical, Static or Dense, e.g. --model.schedule "
                             "SkipDecode --model.schedule.min_layers 8; only an export directory brings its own "
                             "schedule")
        return self.schedule_family

    def check_model(self, strategy: Strategy | None = None) -> PretrainedConfig | None:
        """Refuse a model that cannot be found, or a schedule that does not fit it, from the model's config alone;
        and a quantized base under a ``strategy`` that shards parameters.

        No weights are read (a GGUF file's header is, once: the config is kept for later calls). The CLI calls it
        before a run directory or an output is written. An export directory is verified as when it is loaded
        (:func:`~skiptrain.export.verify.verify_export`); LoRA ``target_modules`` are matched against the
        architecture.

        Returns:
            The model's (or the export's) transformers config, or ``None`` for a model already built.

        Raises:
            ModelError: for a model that cannot be found or is not a causal LM.
            ExportError: for an export that cannot be used.
            ScheduleError: for schedule parameters the model's layer count does not allow.
            UsageError: for a missing schedule, LoRA targets that match no layer, or quantization under FSDP or
                DeepSpeed.
        """
        if self.quantization is not None and strategy is not None:
            check_quantization_strategy(strategy)
        if self.model is not None:
            return None
        if self.source.kind == "export":
            return export_config(self.source.name)  # its own schedule, verified with it
        if self._model_config is None:
            self._model_config = load_config(self.model_name)
        self._schedule_family().build(self._model_config.num_hidden_layers)
        if self.lora is not None:
            check_targets(self._model_config, self.lora.get("target_modules"))
        return self._model_config

    def weights_dtype(self) -> torch.dtype:
        """The dtype the model's weights load in: ``model.dtype``, or what the trainer's precision implies for what
        is trained (fp32 when no trainer is attached)."""
        precision = self._trainer.precision if self._trainer is not None else "32-true"
        override = self.hparams.get("dtype", "auto")  # absent from checkpoints written before model.dtype
        return weights_dtype(precision, trains_all_weights=self.lora is None, override=override)

    def configure_model(self) -> None:
        """Load the model here (not in ``__init__``) so sharded strategies can build it."""
        if self.model is not None:
            return
        family = self._schedule_family()
        model = load_causal_lm(self.model_name, attn_implementation=self.hparams.attn_implementation,
                               dtype=self.weights_dtype(), quantization_config=self._quantization_config()).train()
        self.schedule = family.build(model.config.num_hidden_layers)
        if self._init_source is not None:
            load_run_weights(model, self._init_source)
        if self._teacher_source is not None:
            teacher = load_trained_model(self._teacher_source, self.hparams.attn_implementation)
            self._teacher = (teacher.eval().requires_grad_(False),)
        if self.quantization is not None:
            # Norms and embeddings in float32, base frozen; activation checkpointing is set below, as without it.
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            use_training_kernels(model)
        if self.lora is not None:
            model = with_adapters(model, self.lora)
        if self.hparams.activation_checkpointing:
            base = model.get_base_model() if isinstance(model, PeftModel) else model
            enable_activation_checkpointing(base)
            if isinstance(model, PeftModel):
                base.enable_input_require_grads()
        self.model = model
        decoder_parts(model)  # fail early on an unsupported architecture or attention implementation
        rank_zero_info(
            f"skiptrain: {self.model_name} ({type(decoder_parts(model).model).__name__}, {self.schedule.num_layers} "
            f"layers, {str(model.dtype).removeprefix('torch.')} weights), schedule {self.schedule.family} "
            f"{self.schedule.params}: {self.schedule.mean_layers_per_token():.2f} layers per generated token "
            f"over its span of {self.schedule.span} tokens, ideal decode speedup "
            f"{self.schedule.sequence_ideal_speedup():.2f}x"
        )

    def load_weights(self, ckpt_path: str | None = None, weights_only: bool | None = None) -> ExportRecord:
        """Load the weights to run: an export's (with its schedule and tokenizer), or the configured model's plus a
        checkpoint's.

        Args:
            ckpt_path: A Lightning checkpoint of a fit run (refused for an export, which has its own weights).
            weights_only: How the checkpoint is unpickled
                (:func:`~skiptrain.training.checkpoints.consolidate_checkpoint`).

        Returns:
            Where the weights came from: the export's record, or a record naming ``model`` as the base model,
            trained with the schedule when a checkpoint was given.

        Raises:
            ExportError: for an export combined with a checkpoint, or an unusable export.
            CheckpointError: for an unusable checkpoint.
        """
        if self.model is None and self.source.kind == "export":
            if ckpt_path:
                raise ExportUsageError(
                    f"model.model={self.model_name!r} is an export (it has its weights); ckpt_path={ckpt_path!r} "
                    "would replace them: give model.model the base model to use a checkpoint"
                )
            exported = self.source.load_export(self.hparams.attn_implementation, self.weights_dtype())
            self.model, self.schedule, self.tokenizer = exported
            rank_zero_info(f"skiptrain: loaded the export {exported.path}; its skip_schedule.json is used "
                           f"(model.schedule and model.lora do not apply to an export)")
            return dataclasses.replace(exported.record, base_model=exported.record.base_model or self.model_name)
        self.configure_model()
        if ckpt_path:
            self.load_state_dict(consolidate_checkpoint(ckpt_path, reference=self, weights_only=weights_only))
        else:
            rank_zero_warn(f"no ckpt_path: using the weights of {self.model_name!r} as loaded, not fine-tuned")
        return ExportRecord(self.model_name, trained_with_schedule=bool(ckpt_path), schedule=self.schedule,
                            base_quantization=self.quantization_settings())

    def quantization_settings(self) -> dict[str, Any] | None:
        """The QLoRA settings the adapters train on, for the run's record (``None``: a full-precision base)."""
        return None if self.quantization is None else dataclasses.asdict(self.quantization)

    def _quantization_config(self) -> BitsAndBytesConfig | None:
        """bitsandbytes' load-time config, its ``auto`` compute dtype following the trainer's precision."""
        if self.quantization is None:
            return None
        return self.quantization.config(self.trainer.precision if self._trainer is not None else None)

    def get_tokenizer(self):
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.model_name)
        return self.tokenizer

    # -- losses --------------------------------------------------------------------------------------------------
    def target_logits(self, batch: dict[str, Any], schedule: SkipSchedule, model: torch.nn.Module | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[N, vocab]`` at the columns that predict a labelled token, and those labels ``[N]``
        (:func:`~skiptrain.training.losses.target_logits`). ``model`` defaults to the model being trained."""
        return target_logits(model or self.model, batch, schedule)

    def teacher_targets(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The distillation teacher's final hidden states ``[N, hidden]`` and float32 logits ``[N, vocab]`` at the
        target columns: the configured teacher at full depth, without gradient. The logits are ``None`` when the KL
        term's weight is 0 (its LM head is not run)."""
        dense = Dense().build(self.schedule.num_layers)
        teacher = self._teacher[0] if self._teacher else self.model
        training = self.model.training
        adapters = self.model.disable_adapter() if self.distillation.teacher == "base" else nullcontext()
        self.model.eval()  # no dropout in the teacher
        try:
            with torch.no_grad(), adapters:
                hidden = target_hidden(teacher, batch, dense)[0]
                logits = decoder_parts(teacher).logits(hidden).float() if self.distillation.weight > 0 else None
                return hidden, logits
        finally:
            self.model.train(training)

    def training_schedule(self) -> SkipSchedule:
        """The schedule of this training step: the target, or its annealed form while a curriculum runs."""
        if self.curriculum is None or self._trainer is None:
            return self.schedule
        total = self.trainer.estimated_stepping_batches
        total = int(total) if math.isfinite(total) else self.trainer.max_steps
        return anneal_from_dense(self.schedule, self.curriculum.progress(self.trainer.global_step, total))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        schedule = self.training_schedule()
        hidden, targets = target_hidden(self.model, batch, schedule)
        logits = decoder_parts(self.model).logits(hidden).float()
        ce = target_cross_entropy(logits, targets)
        loss = ce
        if self.hparams.dense_loss_weight > 0:
            dense_ce = target_cross_entropy(*self.target_logits(batch, Dense().build(schedule.num_layers)))
            loss = loss + self.hparams.dense_loss_weight * dense_ce
            self.log("train/ce_dense", dense_ce, on_step=True)
        if self.distillation is not None:
            teacher_hidden, teacher_logits = self.teacher_targets(batch)
            if teacher_logits is not None:
                kl = distillation_kl(logits, teacher_logits, self.distillation.temperature)
                loss = loss + self.distillation.weight * kl
                self.log("train/kl", kl, on_step=True, prog_bar=False)
            if self.distillation.hidden_weight > 0:
                mse = hidden_state_mse(hidden, teacher_hidden)
                loss = loss + self.distillation.hidden_weight * mse
                self.log("train/hidden_mse", mse, on_step=True)
        self.log("train/loss", loss, on_step=True, prog_bar=True)
        self.log("train/ce", ce, on_step=True)
        self.log("train/mean_layers", mean_layers_per_target(batch, schedule), on_step=True)
        return loss

    def on_fit_start(self) -> None:
        for teacher in self._teacher:
            teacher.to(self.device)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._step_started = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Tokens per second of the whole step: forward, backward and optimizer."""
        seconds = time.perf_counter() - self._step_started
        self.log("train/tokens_per_s", float(batch["attention_mask"].sum()) / seconds, on_step=True, prog_bar=True)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.log("train/lr", optimizer.param_groups[0]["lr"], on_step=True)

    # -- evaluation ------------------------------------------------------------------------------------------------
    @property
    def scored_schedule(self) -> SkipSchedule:
        """The schedule validation, test and predict run under: the model's, or the one given to
        :meth:`scored_under`."""
        return self._scored_schedule or self.schedule

    @contextmanager
    def scored_under(self, schedule: SkipSchedule) -> Iterator[None]:
        """Validate, test and predict under ``schedule`` inside the block (e.g. the dense column of ``evaluate``);
        the model's own schedule, which training and export use, is unchanged."""
        self._scored_schedule = schedule
        try:
            yield
        finally:
            self._scored_schedule = None

    def _evaluate(self, batch: dict[str, Any], batch_idx: int, stage: str) -> None:
        weight = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        if weight == 0:
            return
        dense = Dense().build(self.schedule.num_layers)
        for name, schedule in (("skip", self.scored_schedule), ("dense", dense)):
            self.metrics.update_loss(name, target_cross_entropy(*self.target_logits(batch, schedule)), weight)
        batches = self.generation.num_batches
        if self.metrics.scores_text and "references" in batch and (batches < 0 or batch_idx < batches):
            predictions = self.generate_text(batch["prompt_input_ids"], batch["prompt_attention_mask"])
            self.metrics.update_text(predictions, batch["references"])

    def _log_evaluation(self, stage: str) -> None:
        """Log the epoch's :class:`~skiptrain.training.metrics.EvaluationMetrics` as ``<stage>/<name>``."""
        for name, value in self.metrics.compute().items():
            self.log(f"{stage}/{name}", value, prog_bar=name == "loss_skip")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "test")

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    def generate_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      schedule: SkipSchedule | None = None) -> list[str]:
        """Generate continuations of left-padded prompts with the skip-aware front-end and decode them."""
        tokenizer = self.get_tokenizer()
        return generate_under_schedule(
            self.model, input_ids, attention_mask, schedule or self.scored_schedule,
            max_new_tokens=self.generation.max_new_tokens, sampling=self.generation.sampling,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            synced=self._trainer is not None and self.trainer.world_size > 1,  # same layer calls on every rank
        ).texts(tokenizer)

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        predictions = self.generate_text(batch["prompt_input_ids"], batch["prompt_attention_mask"])
        sources = batch.get("sources") or [""] * len(predictions)
        return [{"source": s, "prediction": p} for s, p in zip(sources, predictions, strict=True)]

    # -- optimisation ----------------------------------------------------------------------------------------------
    def configure_optimizers(self) -> dict[str, Any]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return self.optimizer_settings.build(params, self.trainer.estimated_stepping_batches)
