"""The Lightning ``Trainer`` with skiptrain's own subcommands: ``export``, ``generate``, ``evaluate``, ``calibrate``
and ``conformance``.

LightningCLI turns every Trainer method named in :meth:`skiptrain.cli.lightning_cli.SkipCLI.subcommands` into a
subcommand whose typed arguments become options, so ``python -m skiptrain export --ckpt_path x.ckpt --output_dir
out/`` calls :meth:`SkipTrainer.export` with the model (and data module) built from the config. Each method adapts the
trainer's device and precision to a library function: :func:`~skiptrain.training.runs.export_checkpoint`,
:func:`~skiptrain.frontends.inference.run_request`, :func:`~skiptrain.training.evaluation.evaluate_against_dense`,
:func:`~skiptrain.training.calibrate.calibrate`, :func:`~skiptrain.frontends.conformance.write_vectors` and
:func:`~skiptrain.frontends.conformance.check_outputs`.

The model is given as usual by ``--model.model`` (or a recipe / a run's ``config.yaml``) and can be:

- a base model plus ``--ckpt_path`` (a Lightning checkpoint of a fit run: full or LoRA weights), or
- an export directory (``skiptrain export`` output): its weights and ``skip_schedule.json`` are used as they are,
  so ``model.schedule`` and ``model.lora`` do not apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.utilities import rank_zero_info
from transformers import PretrainedConfig

from skiptrain.core.candidates import CalibrationRequest
from skiptrain.core.output_dir import check_output_dir
from skiptrain.core.schedule_files import schedule_from_file
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.errors import UsageError
from skiptrain.export.hub import check_can_push, push_export
from skiptrain.export.record import ExportRecord
from skiptrain.frontends.conformance import (
    DEFAULT_MARGIN,
    DEFAULT_TOP,
    ConformanceReport,
    check_outputs,
    check_vector_options,
    read_outputs,
    read_vectors,
    write_vectors,
)
from skiptrain.frontends.decode import Decoder
from skiptrain.frontends.inference import prepare_prompts, run_request
from skiptrain.frontends.prompts import STDIO, LongPrompts, check_batch_size, chosen_prompt_format, read_prompts
from skiptrain.frontends.request import GenerationRequest
from skiptrain.frontends.speed import GenerationReport
from skiptrain.modeling.generation import SamplingConfig
from skiptrain.modeling.loading import context_length
from skiptrain.shipped.prompt_format import PromptFormat
from skiptrain.training.calibrate import Calibration, calibrate, validation_batches
from skiptrain.training.calibration_report import require_matplotlib, write_calibration
from skiptrain.training.evaluation import evaluate_against_dense
from skiptrain.training.module import SkipLM
from skiptrain.training.precision import resolve_precision
from skiptrain.training.runs import export_checkpoint, recorded_prompt_format


class SkipTrainer(L.Trainer):
    """The Lightning Trainer, with skiptrain's `export`, `generate`, `evaluate`, `calibrate` and `conformance`.

    Args:
        precision: As Lightning's, plus ``auto``: what the device runs natively (``bf16-mixed`` on CUDA with bf16
            and on CPUs with AVX512-BF16 or AMX, ``16-mixed`` on older CUDA, else ``32-true``); see
            docs/cli.md, "Precision".
        kwargs: Lightning's ``Trainer`` arguments.
    """

    def __init__(self, *, precision: _PRECISION_INPUT | Literal["auto"] | None = None, **kwargs: Any) -> None:
        super().__init__(precision=resolve_precision(precision, kwargs.get("accelerator", "auto")), **kwargs)

    def _load(self, model: SkipLM, ckpt_path: str | None, weights_only: bool | None) -> ExportRecord:
        """Give ``model`` its weights (:meth:`~skiptrain.training.module.SkipLM.load_weights`) in the dtype this
        trainer's precision implies (``model.dtype``); returns where they came from."""
        model.trainer = self
        return model.load_weights(ckpt_path, weights_only)

    def _place_for_inference(self, model: SkipLM) -> torch.device:
        """Move the loaded module to this trainer's device and precision, in eval mode; returns the device."""
        device = self.strategy.root_device
        self.precision_plugin.convert_module(model).to(device).eval()  # in place: the module keeps its own model
        return device

    def export(
        self,
        model: SkipLM,
        datamodule: SkipDataModule | None = None,
        ckpt_path: str | None = None,
        weights_only: bool | None = None,
        *,
        output_dir: str,
        adapter_only: bool = False,
        overwrite: bool = False,
        push_to_hub: str | None = None,
        hub_private: bool | None = None,
        draft_vocab_size: int | None = None,
    ) -> Path:
        """Export a checkpoint for inference: a Hugging Face model directory plus skip_schedule.json.

        Args:
            model: The module, configured like the run that wrote the checkpoint.
            datamodule: The run's data module (only its task name is recorded); optional.
            ckpt_path: Lightning checkpoint of the fit run (full or LoRA weights); its model hyperparameters
                configure ``model``. Without it the base model is exported with ``trained_with_schedule: false``.
            weights_only: How the checkpoint is unpickled, as in ``fit``: ``null``/``true`` tensors and plain data
                only, ``false`` any object (trusted checkpoints only).
            output_dir: Directory to write; must be absent or empty unless ``overwrite``.
            adapter_only: Save only the LoRA adapter (plus ``skip_schedule.json`` naming the base model) instead of
                merged weights.
            overwrite: Replace a non-empty ``output_dir`` (only once the new export is complete and checked).
            push_to_hub: Also upload the export to this Hub model repository (``user/model``), created when absent,
                with huggingface_hub's own upload and credentials; refused offline before anything is written.
            hub_private: Visibility of a repository that ``push_to_hub`` creates (default: the Hub's).
            draft_vocab_size: Record the N most frequent target tokens of the data's training split as the draft
                vocabulary of ``generate --speculative`` (``draft_vocab.json``); needs the run's data.

        Returns:
            The export directory. A module whose model was built here has its LoRA adapters merged in place.
        """
        if push_to_hub is not None:
            check_can_push(push_to_hub)
        model.trainer = self  # the weights load in the dtype its precision implies
        directory = export_checkpoint(model, output_dir, ckpt_path, datamodule, weights_only,
                                      adapter_only=adapter_only, overwrite=overwrite,
                                      draft_vocab_size=draft_vocab_size)
        if push_to_hub is not None:
            commit = push_export(directory, push_to_hub, hub_private)
            rank_zero_info(f"skiptrain: uploaded {directory} to the Hub: {commit}")
        return directory

    def generate(
        self,
        model: SkipLM,
        ckpt_path: str | None = None,
        weights_only: bool | None = None,
        *,
        prompts: str = STDIO,
        output: str = STDIO,
        max_new_tokens: int | None = None,
        batch_size: int = 8,
        sampling: SamplingConfig | None = None,
        dense: bool = False,
        compare_dense: bool = False,
        long_prompts: LongPrompts = "refuse",
        speculative: int = 0,
        draft_schedule: str | None = None,
        draft_vocab: str | None = None,
        draft_confidence: float = 0.0,
        raw_prompts: bool = False,
        prompt: str | None = None,
        stop: list[str] | None = None,
    ) -> GenerationReport:
        """``skiptrain generate`` of a base model with a fit run's checkpoint (an export runs without Lightning:
        :mod:`skiptrain.cli.generate`, whose options these are).

        Args:
            model: The module; ``model.model`` is the base model (or an export).
            ckpt_path: Lightning checkpoint of a fit run, when ``model.model`` is the base model.
            weights_only: How the checkpoint is unpickled, as in ``fit``: ``null``/``true`` tensors and plain data
                only, ``false`` any object (trusted checkpoints only).
            max_new_tokens: default ``model.generation.max_new_tokens``.
            sampling: default ``model.generation.sampling``.
            prompts, output, batch_size, dense, compare_dense, long_prompts, speculative, draft_schedule,
            draft_vocab, draft_confidence, raw_prompts, prompt, stop: the fields of
            :class:`~skiptrain.frontends.request.GenerationRequest`.
        """
        request = GenerationRequest(
            max_new_tokens=model.generation.max_new_tokens if max_new_tokens is None else max_new_tokens,
            batch_size=batch_size, sampling=sampling or model.generation.sampling, dense=dense,
            compare_dense=compare_dense, long_prompts=long_prompts, speculative=speculative,
            draft_schedule=draft_schedule, draft_vocab=draft_vocab, draft_confidence=draft_confidence,
            raw_prompts=raw_prompts, prompts=prompts, prompt=prompt,
            stop=tuple(stop or ()), output=output)
        config = _model_config(model)
        request = request.with_draft_vocab(config.vocab_size)
        draft = request.draft_schedule and \
            schedule_from_file(request.draft_schedule, config.num_hidden_layers, "draft_schedule")  # before loading
        prompt_list, prompt_format = prepare_prompts(request, model.get_tokenizer(), context_length(config),
                                                     _prompt_format(model, ckpt_path, weights_only, raw_prompts))
        self._load(model, ckpt_path, weights_only)
        decoder = Decoder(model.model, model.get_tokenizer(), prompt_format, self._place_for_inference(model),
                          self.precision_plugin.forward_context)
        return run_request(decoder, draft or model.schedule, request, prompt_list)

    def evaluate(
        self,
        model: SkipLM,
        datamodule: SkipDataModule,
        ckpt_path: str | None = None,
        weights_only: bool | None = None,
        *,
        output: str | None = None,
    ) -> dict[str, dict[str, float]]:
        """Score a model on the task's test split under its skip schedule and dense, as one table.

        Runs ``trainer.test`` twice, under the schedule and with a dense schedule: loss and perplexity (both),
        and the task's ROUGE-1/2/L or multi-reference BLEU from generated text (``model.generation``:
        ``num_batches: -1`` scores every test batch, the default scores 2). Mean executed layers and ideal
        speedup are taken over ``model.generation.max_new_tokens`` generated tokens.

        Args:
            model: The module; ``model.model`` may be an export directory.
            datamodule: The task's data module (its test split is scored).
            ckpt_path: Lightning checkpoint of a fit run, when ``model.model`` is the base model.
            weights_only: How the checkpoint is unpickled, as in ``fit``: ``null``/``true`` tensors and plain data
                only, ``false`` any object (trusted checkpoints only).
            output: Also write the table as JSON to this file.

        An export's recorded prompt format makes the test prompts unless ``data.prompt_template`` is given.
        """
        recorded = self._load(model, ckpt_path, weights_only).prompt_format
        if recorded is not None and datamodule.hparams.get("prompt_template") is None and \
                not datamodule.hparams.get("chat_template"):
            datamodule.use_prompt_format(recorded)
            rank_zero_info("skiptrain evaluate: the test prompts are made by the export's recorded prompt format")
        return evaluate_against_dense(self, model, datamodule, output)

    def calibrate(
        self,
        model: SkipLM,
        datamodule: SkipDataModule,
        ckpt_path: str | None = None,
        weights_only: bool | None = None,
        *,
        output_dir: str,
        targets: list[float] | None = None,
        families: list[str] | None = None,
        grid: str | None = None,
        num_batches: int = -1,
        per_target: int = 2,
        tolerance: float = 0.1,
        generation_batches: int = 0,
        overwrite: bool = False,
    ) -> Calibration:
        """Choose a skip schedule from data: score candidate schedules by their teacher-forced validation loss.

        Measures the layer importance profile, scores every candidate with one forward pass over the validation
        batches (loss, perplexity, realised mean executed layers and ideal speedup over the targets' lengths),
        and writes the table, the Pareto front and importance plots, and for each target speedup the best
        schedule as a recipe fragment (``schedule_<T>x.yaml``) into ``output_dir``.

        Args:
            model: The module; ``model.model`` may be an export directory. Its own schedule is not used.
            datamodule: The task's data module (its validation split is scored).
            ckpt_path: Lightning checkpoint of a fit run, when ``model.model`` is the base model.
            weights_only: How the checkpoint is unpickled, as in ``fit``.
            output_dir: Directory to write; must be absent or empty unless ``overwrite``.
            targets: Target ideal decode speedups; default ``[1.5, 2, 3]``.
            families: Families searched for each target: ``skipdecode``, ``ranked``, ``hierarchical``, ``static``;
                default all four.
            grid: YAML file ``{family: {parameter: [values]}}``: score every combination instead of searching.
            num_batches: Validation batches scored (``-1``: all; ``data.max_eval_samples`` sets the split size).
            per_target: Configurations scored per family and target in the search.
            tolerance: The search scores speedups in ``[target, target * (1 + tolerance)]``.
            generation_batches: Validation batches on which the Pareto front is also decoded and scored with the
                task's ROUGE or BLEU (0: none).
            overwrite: Replace a non-empty ``output_dir``.
        """
        check_output_dir(output_dir, overwrite)
        require_matplotlib()
        request = CalibrationRequest.checked(_model_config(model).num_hidden_layers, targets, families, grid,
                                             per_target, tolerance, num_batches, generation_batches)
        batches = validation_batches(datamodule, request.num_batches)
        self._load(model, ckpt_path, weights_only)
        batches = move_data_to_device(batches, self._place_for_inference(model))
        with self.precision_plugin.forward_context():
            result = calibrate(model, batches, targets=request.targets, families=request.families, grid=request.grid,
                               per_target=request.per_target, tolerance=request.tolerance,
                               generation_batches=batches[:request.generation_batches], metric=datamodule.metric)
        write_calibration(result, output_dir, overwrite)
        rank_zero_info(f"skiptrain calibrate: {len(result.candidates)} schedules scored on "
                       f"{sum(result.lengths)} validation target tokens; wrote {output_dir}")
        return result

    def conformance(
        self,
        model: SkipLM,
        ckpt_path: str | None = None,
        weights_only: bool | None = None,
        *,
        vectors: str,
        prompts: str = STDIO,
        check: str | None = None,
        max_new_tokens: int | None = None,
        batch_size: int = 8,
        top: int = DEFAULT_TOP,
        margin: float | None = None,
        lossless: bool = False,
        raw_prompts: bool = False,
    ) -> ConformanceReport | None:
        """Write conformance test vectors for other inference engines, or check an engine's outputs against them.

        Without ``check``: decode ``prompts`` greedily under the model's schedule (exactly ``max_new_tokens`` tokens
        each, no end-of-sequence stop) and write ``vectors``: the schedule, each prompt's token ids, the greedy
        tokens and the top logits of every step. With ``check``: compare the engine's JSON lines
        (``{"id", "token_ids"}``) with ``vectors`` (the model is not loaded) and exit with status 1 on a divergence.

        Args:
            model: The module; ``model.model`` is usually an export directory.
            ckpt_path: Lightning checkpoint of a fit run, when ``model.model`` is the base model.
            weights_only: How the checkpoint is unpickled, as in ``fit``.
            vectors: The vectors file (JSON) to write, or to check against.
            prompts: ``.jsonl`` file with a ``prompt`` field per line, text file with one prompt per line, or ``-``.
            check: An engine's JSON-lines output to check instead of writing vectors.
            max_new_tokens: Tokens per prompt; default ``model.generation.max_new_tokens``.
            batch_size: Prompts decoded together by the reference decoder.
            top: Top logits recorded per step.
            margin: Logit gap that counts as a tie: when writing, the default stored in the vectors
                (default 1e-3); when checking, overrides it.
            lossless: Write vectors for a speculative implementation that drafts under the schedule: the reference
                decodes at full depth, whose output such an implementation must equal.
            raw_prompts: Use each prompt as it is, not as a source of the model's recorded prompt format.
        """
        if check is not None:
            report = check_outputs(read_vectors(vectors, model.source.schedule()), read_outputs(check), margin)
            if not report.passed:
                raise SystemExit(report.summary())
            rank_zero_info(report.summary())
            return report
        max_new_tokens = _max_new_tokens(model, max_new_tokens)
        check_batch_size(batch_size)
        check_vector_options(top, margin)
        prompt_list = read_prompts(prompts)
        prompt_format = _prompt_format(model, ckpt_path, weights_only, raw_prompts)
        _model_config(model)
        self._load(model, ckpt_path, weights_only)
        device = self._place_for_inference(model)
        written = write_vectors(
            model.model, model.get_tokenizer(), model.schedule, prompt_list, vectors, prompt_format=prompt_format,
            max_new_tokens=max_new_tokens, batch_size=batch_size, top=top,
            margin=DEFAULT_MARGIN if margin is None else margin, device=device,
            context=self.precision_plugin.forward_context, lossless=lossless,
        )
        rank_zero_info(f"skiptrain conformance: wrote {len(written['cases'])} cases of {written['max_new_tokens']} "
                       f"greedy tokens to {vectors}")
        return None


def _prompt_format(model: SkipLM, ckpt_path: str | None, weights_only: bool | None, raw: bool) -> PromptFormat:
    """The prompt format that makes prompts from the given ones: the model's recorded one, or raw."""
    return chosen_prompt_format(None if raw else recorded_prompt_format(model, ckpt_path, weights_only=weights_only),
                                raw)


def _max_new_tokens(model: SkipLM, given: int | None) -> int:
    """``given``, or ``model.generation.max_new_tokens`` when left out; refused below 1."""
    if given is None:
        return model.generation.max_new_tokens
    if given < 1:
        raise UsageError(f"max_new_tokens={given} is invalid: allowed >= 1 (leave it out for "
                         f"model.generation.max_new_tokens={model.generation.max_new_tokens})")
    return given


def _model_config(model: SkipLM) -> PretrainedConfig:
    """The architecture ``model`` will have, checked (:meth:`~skiptrain.training.module.SkipLM.check_model`) before any
    weights are read; the loaded model's own when it is already built."""
    config = model.check_model()
    return config if config is not None else model.model.config


__all__ = ["SkipTrainer"]
