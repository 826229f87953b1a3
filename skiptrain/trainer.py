"""The Lightning ``Trainer`` with skiptrain's own subcommands: ``export``, ``generate`` and ``evaluate``.

LightningCLI turns every Trainer method named in :meth:`skiptrain.cli.SkipCLI.subcommands` into a subcommand whose
typed arguments become options, so ``python -m skiptrain export --ckpt_path x.ckpt --output_dir out/`` calls
:meth:`SkipTrainer.export` with the model (and data module) built from the config.

The model is given as usual by ``--model.model`` (or a recipe / a run's ``config.yaml``) and can be:

- a base model plus ``--ckpt_path`` (a Lightning checkpoint of a fit run: full or LoRA weights), or
- an export directory (``skiptrain export`` output): its weights and ``skip_schedule.json`` are used as they are,
  so ``model.schedule`` and ``model.lora`` do not apply.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from skiptrain.checkpoints import checkpoint_metadata, consolidate_checkpoint
from skiptrain.data import SOURCE_PLACEHOLDER, SkipDataModule, collate, encode_prompts
from skiptrain.export import (
    NOT_RECORDED,
    RUN_CONFIG_FILE,
    ExportError,
    ExportInfo,
    check_target,
    export_module,
    find_run_file,
    hyperparameters_yaml,
    is_export,
    load_exported,
    validation_metrics_from_checkpoint,
)
from skiptrain.generation import SamplingConfig, generate
from skiptrain.module import SkipLM
from skiptrain.schedules import Dense, SkipSchedule

STDIO = "-"


# -- weights -----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Weights:
    """Where a module's weights came from (what an export records)."""

    base_model: str
    trained_with_schedule: bool


def load_weights(module: SkipLM, ckpt_path: str | None, weights_only: bool | None = None) -> Weights:
    """Give ``module`` its model: from an export directory, or built from its config plus a checkpoint's weights.

    Args:
        module: A :class:`~skiptrain.module.SkipLM`; ``module.model_name`` may be an export directory.
        ckpt_path: A Lightning checkpoint of a fit run (refused for an export, which has its own weights).
        weights_only: How the checkpoint is unpickled (see :func:`~skiptrain.checkpoints.consolidate_checkpoint`).

    Raises:
        ExportError: for an export combined with a checkpoint, or an unusable export or checkpoint.
    """
    if module.model is None and is_export(module.model_name):
        if ckpt_path:
            raise ExportError(
                f"model.model={module.model_name!r} is an export (it has its weights); ckpt_path={ckpt_path!r} "
                "would replace them: give model.model the base model to use a checkpoint"
            )
        exported = load_exported(module.model_name, attn_implementation=module.hparams.attn_implementation)
        module.model, module.schedule, module.tokenizer = exported
        rank_zero_info(f"skiptrain: loaded the export {exported.path}; its skip_schedule.json is used "
                       f"(model.schedule and model.lora do not apply to an export)")
        return Weights(exported.record.get("base_model") or module.model_name,
                       bool(exported.record.get("trained_with_schedule")))
    module.configure_model()
    if ckpt_path:
        module.load_state_dict(consolidate_checkpoint(ckpt_path, reference=module, weights_only=weights_only))
    else:
        rank_zero_warn(f"no ckpt_path: using the weights of {module.model_name!r} as loaded, not fine-tuned")
    return Weights(module.model_name, trained_with_schedule=bool(ckpt_path))


def checkpoint_info(ckpt_path: str | None, module: SkipLM, datamodule: SkipDataModule | None, weights: Weights,
                    weights_only: bool | None = None) -> ExportInfo:
    """What an export from a checkpoint (or from the module's config alone) records about the run."""
    data_hparams = dict(datamodule.hparams) if datamodule is not None else None
    if not ckpt_path:
        return ExportInfo(weights.base_model, weights.trained_with_schedule,
                          task=datamodule.task if datamodule is not None else None,
                          training_config=hyperparameters_yaml(module.hparams, data_hparams))
    metadata = checkpoint_metadata(ckpt_path, weights_only)
    stored_data = metadata.get("datamodule_hyper_parameters") or {}
    config_file = find_run_file(ckpt_path, RUN_CONFIG_FILE)
    training_config = (config_file.read_text() if config_file is not None else
                       hyperparameters_yaml(metadata.get("hyper_parameters") or {}, stored_data or data_hparams))
    metrics, source = validation_metrics_from_checkpoint(ckpt_path, metadata)
    task = datamodule.task if datamodule is not None else stored_data.get("task")
    return ExportInfo(weights.base_model, weights.trained_with_schedule, task=task, training_config=training_config,
                      metrics=metrics, metrics_source=source)


# -- prompts and completions -------------------------------------------------------------------------------------------
def read_prompts(path: str, stdin: TextIO | None = None) -> list[str]:
    """Prompts from a ``.jsonl`` file (a ``prompt`` field per line), a text file (one prompt per line) or stdin.

    Stdin (``path == "-"``) is read as JSON lines when its first non-blank line starts with ``{``, else as text.

    Raises:
        ValueError: naming the line of a malformed JSON line, a line without a string ``prompt``, or an empty prompt.
    """
    if path == STDIO:
        text, origin = (stdin or sys.stdin).read(), "stdin"
        as_json = text.lstrip().startswith("{")
    else:
        text, origin = Path(path).read_text(), path
        as_json = Path(path).suffix.lower() in (".jsonl", ".json")
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if as_json:
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{origin} line {number}: not valid JSON: {err}") from err
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise ValueError(f"{origin} line {number}: expected an object with a string 'prompt' field")
            line = record["prompt"]
        if not line.strip():
            raise ValueError(f"{origin} line {number}: empty prompt")
        prompts.append(line)
    if not prompts:
        raise ValueError(f"{origin}: no prompts")
    return prompts


@dataclass(frozen=True)
class Completion:
    """One generated completion (a line of ``generate``'s JSON-lines output)."""

    prompt: str
    completion: str
    num_tokens: int
    """Generated tokens, the end-of-sequence token included."""
    token_ids: list[int]
    """The generated token ids (``num_tokens`` of them)."""


@dataclass(frozen=True)
class DecodeStats:
    """Cost of decoding a set of prompts under one schedule."""

    num_tokens: int
    seconds: float
    executed_layers: int
    """Sum over generated tokens of the decoder layers each one runs, ``|E(g)|``."""

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else float("inf")

    @property
    def mean_layers_per_token(self) -> float:
        return self.executed_layers / max(self.num_tokens, 1)


def complete(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    prompts: Sequence[str],
    max_new_tokens: int,
    batch_size: int = 8,
    sampling: SamplingConfig | None = None,
    device: torch.device | str = "cpu",
    context: Callable[[], AbstractContextManager] = nullcontext,
) -> tuple[list[Completion], DecodeStats]:
    """Generate completions of ``prompts`` in batches of ``batch_size`` with the skip-aware front-end.

    Prompts are tokenised as the data module tokenises training prompts and left-padded per batch
    (:func:`skiptrain.data.collate`); decoding is :func:`skiptrain.generation.generate`, inside a fresh
    ``context()`` per batch (e.g. the precision plugin's autocast).

    Returns:
        The completions in prompt order, and the decoding cost (wall time of the decoding calls only).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is invalid: allowed >= 1")
    _, prompt_ids = encode_prompts(tokenizer, SOURCE_PLACEHOLDER, list(prompts), max_source_tokens=sys.maxsize)
    completions: list[Completion] = []
    seconds, layers = 0.0, 0
    for start in range(0, len(prompt_ids), batch_size):
        batch = collate([{"prompt_ids": ids, "target_ids": []} for ids in prompt_ids[start:start + batch_size]],
                        tokenizer.pad_token_id)
        started = time.perf_counter()
        with context():
            out = generate(model, batch["prompt_input_ids"].to(device), batch["prompt_attention_mask"].to(device),
                           schedule, max_new_tokens=max_new_tokens, sampling=sampling,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        seconds += time.perf_counter() - started
        rows = zip(out.tokens.tolist(), out.lengths.tolist(), out.texts(tokenizer), strict=True)
        for offset, (row, n, text) in enumerate(rows):
            layers += schedule.layers_run(n)
            completions.append(Completion(prompts[start + offset], text, n, row[:n]))
    return completions, DecodeStats(sum(c.num_tokens for c in completions), seconds, layers)


@dataclass(frozen=True)
class GenerationReport:
    """What ``skiptrain generate`` produced and measured."""

    completions: list[Completion]
    schedule: SkipSchedule
    """The schedule the completions were decoded with (dense with ``--dense``)."""
    stats: DecodeStats
    dense_stats: DecodeStats | None = None
    """Dense decoding of the same prompts (with ``--compare_dense``)."""

    @property
    def measured_speedup(self) -> float | None:
        """Tokens/s under the schedule over tokens/s of dense decoding of the same prompts."""
        return None if self.dense_stats is None else self.stats.tokens_per_s / self.dense_stats.tokens_per_s

    def summary(self) -> str:
        lines = [
            f"skiptrain generate: {len(self.completions)} prompts, {self.stats.num_tokens} tokens in "
            f"{self.stats.seconds:.2f} s ({self.stats.tokens_per_s:.1f} tokens/s), schedule {self.schedule.family}: "
            f"{self.stats.mean_layers_per_token:.2f} of {self.schedule.num_layers} decoder layers per generated token"
        ]
        if self.dense_stats is not None:
            ideal = self.schedule.num_layers / self.stats.mean_layers_per_token
            lines.append(
                f"dense decoding of the same prompts: {self.dense_stats.num_tokens} tokens in "
                f"{self.dense_stats.seconds:.2f} s ({self.dense_stats.tokens_per_s:.1f} tokens/s); measured speedup "
                f"{self.measured_speedup:.2f}x (ideal {ideal:.2f}x)"
            )
        return "\n".join(lines)


def write_completions(completions: Sequence[Completion], path: str, stdout: TextIO | None = None) -> None:
    """Write JSON lines (``prompt``, ``completion``, ``num_tokens``, ``token_ids``) to a file or stdout (``-``)."""
    text = "".join(json.dumps(asdict(c), ensure_ascii=False) + "\n" for c in completions)
    if path == STDIO:
        (stdout or sys.stdout).write(text)
        (stdout or sys.stdout).flush()
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


# -- evaluation --------------------------------------------------------------------------------------------------------
GENERATION_METRICS = ("rouge1", "rouge2", "rougeL", "bleu")


def evaluation_table(scheduled: dict[str, float], dense: dict[str, float], schedule: SkipSchedule,
                     generation_length: int) -> dict[str, dict[str, float]]:
    """Metrics under the schedule and dense from two ``trainer.test`` runs (the second one with a dense schedule).

    Args:
        scheduled: ``test/*`` metrics of the run under the schedule (its ``loss_dense`` is the dense loss).
        dense: ``test/*`` metrics of the run with the dense schedule.
        schedule: The schedule.
        generation_length: Tokens over which the mean executed layers are counted.

    Returns:
        ``{"schedule": {metric: value}, "dense": {metric: value}}``.
    """
    table: dict[str, dict[str, float]] = {"schedule": {}, "dense": {}}
    for name, key in (("loss", "loss"), ("perplexity", "ppl")):
        if f"test/{key}_skip" in scheduled:
            table["schedule"][name] = scheduled[f"test/{key}_skip"]
            table["dense"][name] = scheduled[f"test/{key}_dense"]
    for name in GENERATION_METRICS:
        if f"test/{name}" in scheduled:
            table["schedule"][name] = scheduled[f"test/{name}"]
            table["dense"][name] = dense.get(f"test/{name}", float("nan"))
    table["schedule"]["mean_layers_per_token"] = schedule.mean_layers_per_token(generation_length)
    table["dense"]["mean_layers_per_token"] = float(schedule.num_layers)
    table["schedule"]["ideal_speedup"] = schedule.ideal_speedup(generation_length)
    table["dense"]["ideal_speedup"] = 1.0
    return table


def format_table(table: dict[str, dict[str, float]]) -> str:
    """A Markdown table with one row per metric and one column per schedule."""
    columns = list(table)
    rows = ["| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for metric in table[columns[0]]:
        rows.append(f"| {metric} | " + " | ".join(f"{table[c].get(metric, float('nan')):.4f}" for c in columns) + " |")
    return "\n".join(rows)


# -- the trainer -------------------------------------------------------------------------------------------------------
class SkipTrainer(L.Trainer):
    """The Lightning Trainer, with the `export`, `generate` and `evaluate` subcommands of skiptrain."""

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

        Returns:
            The export directory. A module whose model was built here has its LoRA adapters merged in place.
        """
        check_target(output_dir, overwrite)  # refuse before loading any weights
        fresh = model.model is None  # built here, so LoRA may be merged into it rather than into a copy
        weights = load_weights(model, ckpt_path, weights_only)
        info = checkpoint_info(ckpt_path, model, datamodule, weights, weights_only)
        return export_module(model, output_dir, info, adapter_only=adapter_only, overwrite=overwrite, in_place=fresh)

    def generate(
        self,
        model: SkipLM,
        datamodule: SkipDataModule | None = None,
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
    ) -> GenerationReport:
        """Generate completions of prompts with batched, KV-cached skip-aware decoding (JSON lines out).

        Args:
            model: The module; ``model.model`` may be an export directory.
            datamodule: Unused (generation needs no data module).
            ckpt_path: Lightning checkpoint of a fit run, when ``model.model`` is the base model.
            weights_only: How the checkpoint is unpickled, as in ``fit``: ``null``/``true`` tensors and plain data
                only, ``false`` any object (trusted checkpoints only).
            prompts: ``.jsonl`` file with a ``prompt`` field per line, text file with one prompt per line, or ``-``
                for stdin.
            output: JSON-lines file for ``{"prompt", "completion", "num_tokens", "token_ids"}``, or ``-`` for stdout
                (the summary goes to stderr).
            max_new_tokens: Tokens generated per prompt at most; default ``model.generation.max_new_tokens``.
            batch_size: Prompts decoded together (left-padded to end at one column).
            sampling: Greedy by default; default ``model.generation.sampling``.
            dense: Decode with every layer, ignoring the schedule.
            compare_dense: Also decode the same prompts densely and report the measured speedup.
        """
        prompt_texts = read_prompts(prompts)
        load_weights(model, ckpt_path, weights_only)
        device = self.strategy.root_device
        model.model = self.precision_plugin.convert_module(model.model).to(device).eval()
        tokenizer = model.get_tokenizer()
        full = Dense().build(model.schedule.num_layers)
        schedule = full if dense else model.schedule
        settings = {
            "max_new_tokens": max_new_tokens or model.generation.max_new_tokens,
            "batch_size": batch_size,
            "sampling": sampling or model.generation.sampling,
            "device": device,
            "context": self.precision_plugin.forward_context,
        }
        complete(model.model, tokenizer, schedule, prompt_texts[:1], **{**settings, "max_new_tokens": 2})  # warm-up
        completions, stats = complete(model.model, tokenizer, schedule, prompt_texts, **settings)
        dense_stats = None
        if compare_dense:
            dense_stats = complete(model.model, tokenizer, full, prompt_texts, **settings)[1]
        write_completions(completions, output)
        report = GenerationReport(completions, schedule, stats, dense_stats)
        rank_zero_info(report.summary())  # stderr: stdout may carry the JSON lines
        return report

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
        ``num_batches: -1`` scores every test batch, the default scores 2).

        Args:
            model: The module; ``model.model`` may be an export directory.
            datamodule: The task's data module (its test split is scored).
            ckpt_path: Lightning checkpoint of a fit run, when ``model.model`` is the base model.
            weights_only: How the checkpoint is unpickled, as in ``fit``: ``null``/``true`` tensors and plain data
                only, ``false`` any object (trusted checkpoints only).
            output: Also write the table as JSON to this file.
        """
        load_weights(model, ckpt_path, weights_only)
        schedule = model.schedule
        scheduled = _floats(self.test(model, datamodule=datamodule, verbose=False))
        model.schedule = Dense().build(schedule.num_layers)
        try:
            dense = _floats(self.test(model, datamodule=datamodule, verbose=False))
        finally:
            model.schedule = schedule
        table = evaluation_table(scheduled, dense, schedule, model.generation.max_new_tokens)
        rank_zero_info(f"skiptrain evaluate ({datamodule.task}, test split), schedule {schedule.family} vs dense:\n"
                       + format_table(table))
        if output and self.is_global_zero:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            Path(output).write_text(json.dumps(table, indent=2) + "\n")
        return table


def _floats(results: list[dict[str, Any]]) -> dict[str, float]:
    return {k: float(v) for k, v in (results[0] if results else {}).items()}


__all__ = [
    "NOT_RECORDED",
    "Completion",
    "DecodeStats",
    "GenerationReport",
    "SkipTrainer",
    "complete",
    "evaluation_table",
    "load_weights",
    "read_prompts",
    "write_completions",
]
