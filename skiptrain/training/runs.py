"""What a training run leaves behind, turned into a model's weights and an export record.

A run is known from one of three sources: a fit that just ended (``ExportCallback``), a checkpoint it wrote
(``skiptrain export --ckpt_path``), or nothing but the configured module (the base model, or an export directory,
as ``model.model``). Each gives the same record through :func:`run_record`, whose training config is the run's
``config.yaml`` when there is one, else the hyperparameters.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from skiptrain.core.output_dir import check_output_dir
from skiptrain.data.datamodule import stored_prompt_format
from skiptrain.data.draft_vocab import check_draft_vocab_size, frequent_target_tokens
from skiptrain.errors import UsageError
from skiptrain.export.format import ADAPTER_ONLY_NEEDS_LORA, ExportError, ExportUsageError, is_export, read_record
from skiptrain.export.record import NOT_RECORDED, ExportedCheckpoint, ExportRecord
from skiptrain.export.write import write_export
from skiptrain.shipped.prompt_format import PromptFormat
from skiptrain.training.checkpoints import checkpoint_layout, checkpoint_metadata

if TYPE_CHECKING:
    import lightning as L

    from skiptrain.data.datamodule import SkipDataModule
    from skiptrain.training.module import SkipLM

RUN_CONFIG_FILE = "config.yaml"  # what LightningCLI's SaveConfigCallback writes into the run's log dir
RUN_METRICS_FILE = "metrics.csv"  # what CSVLogger writes into the run's log dir
VALIDATION_PREFIX = "val/"


# -- the record ------------------------------------------------------------------------------------------------------
def run_record(
    weights: ExportRecord,
    *,
    task: str | None,
    config_file: Path | None,
    model_hparams: Mapping[str, Any],
    data_hparams: Mapping[str, Any] | None,
    metrics: Mapping[str, float] | None = None,
    metrics_source: str = NOT_RECORDED,
) -> ExportRecord:
    """``weights`` (where the weights came from) completed with what is known about the run.

    Args:
        weights: Base model, ``trained_with_schedule`` and schedule of the weights
            (e.g. :meth:`~skiptrain.training.module.SkipLM.load_weights`).
        task: The run's task name, if known.
        config_file: The run's ``config.yaml``, if there is one; it is the training config as written.
        model_hparams: Model hyperparameters, reconstructed into the training config without ``config_file``.
        data_hparams: Data hyperparameters, likewise (``None`` when there is no data module).
        metrics: Validation metrics.
        metrics_source: Where ``metrics`` came from.
    """
    if config_file is not None and config_file.is_file():
        training_config = config_file.read_text()
    else:
        training_config = hyperparameters_yaml(model_hparams, data_hparams)
    return dataclasses.replace(weights, task=task, training_config=training_config, metrics=dict(metrics or {}),
                               metrics_source=metrics_source)


def best_checkpoint(trainer: L.Trainer) -> tuple[str, ExportedCheckpoint] | None:
    """The checkpoint that a ``ModelCheckpoint(monitor=...)`` of this fit kept as best, or ``None`` when none did."""
    for callback in trainer.checkpoint_callbacks:
        if getattr(callback, "monitor", None) and callback.best_model_path and callback.best_model_score is not None:
            step = int(checkpoint_metadata(callback.best_model_path).get("global_step") or 0)
            chosen = ExportedCheckpoint("best", step, callback.monitor, float(callback.best_model_score))
            return callback.best_model_path, chosen
    return None


def fit_record(trainer: L.Trainer, module: SkipLM, best: tuple[str, ExportedCheckpoint] | None = None
               ) -> ExportRecord:
    """The record of a run that just finished fitting: its log dir's config and validation metrics.

    Args:
        trainer: The trainer that ran fit.
        module: The fitted module.
        best: The best checkpoint (:func:`best_checkpoint`) when that is what is exported: the metrics are then
            those logged up to its step. Otherwise the weights are the last, with the last validation's metrics.
    """
    datamodule = getattr(trainer, "datamodule", None)
    weights = ExportRecord(module.model_name, trained_with_schedule=trainer.global_step > 0, schedule=module.schedule,
                           base_quantization=module.quantization_settings())
    if best is None:
        checkpoint = ExportedCheckpoint("last", trainer.global_step)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(VALIDATION_PREFIX)}
        source = "the run's last validation (trainer.callback_metrics at the end of fit)"
    else:
        for logger in trainer.loggers:
            logger.save()  # metrics.csv up to date before it is read
        path, checkpoint = best
        metrics, source = validation_metrics_from_checkpoint(path, checkpoint_metadata(path))
    record = run_record(
        weights,
        task=getattr(datamodule, "task", None),
        config_file=Path(trainer.log_dir or trainer.default_root_dir) / RUN_CONFIG_FILE,
        model_hparams=module.hparams,
        data_hparams=datamodule.hparams if datamodule is not None else None,
        metrics=metrics,
        metrics_source=source,
    )
    prompt_format = datamodule.prompt_format if datamodule is not None else None
    return dataclasses.replace(record, checkpoint=checkpoint, prompt_format=prompt_format)


def checkpoint_record(
    weights: ExportRecord,
    ckpt_path: str | None,
    module: SkipLM,
    datamodule: SkipDataModule | None,
    weights_only: bool | None = None,
) -> ExportRecord:
    """The record of the run that wrote ``ckpt_path`` (or, without one, of the configured module alone).

    The training config is the run's ``config.yaml`` beside the checkpoint, else the hyperparameters stored in the
    checkpoint; metrics are the run's validation metrics (:func:`validation_metrics_from_checkpoint`).
    """
    data_hparams = dict(datamodule.hparams) if datamodule is not None else None
    task = datamodule.task if datamodule is not None else None
    prompt_format = datamodule.prompt_format if datamodule is not None else weights.prompt_format
    if not ckpt_path:
        record = run_record(weights, task=task, config_file=None, model_hparams=module.hparams,
                            data_hparams=data_hparams)
        return dataclasses.replace(record, prompt_format=prompt_format)
    metadata = checkpoint_metadata(ckpt_path, weights_only)
    stored_data = metadata.get("datamodule_hyper_parameters") or {}
    metrics, source = validation_metrics_from_checkpoint(ckpt_path, metadata)
    record = run_record(
        weights,
        task=task or stored_data.get("task"),
        config_file=find_run_file(ckpt_path, RUN_CONFIG_FILE),
        model_hparams=metadata.get("hyper_parameters") or {},
        data_hparams=stored_data or data_hparams,
        metrics=metrics,
        metrics_source=source,
    )
    return dataclasses.replace(record, checkpoint=exported_checkpoint(ckpt_path, metadata),
                               prompt_format=prompt_format or stored_prompt_format(stored_data))


def exported_checkpoint(ckpt_path: str | os.PathLike, metadata: Mapping[str, Any]) -> ExportedCheckpoint:
    """Which weights of its run a checkpoint holds: ``best`` when its ``ModelCheckpoint`` state names it as the best
    by a monitored metric, else ``last`` (the weights at its step)."""
    step = int(metadata.get("global_step") or 0)
    for name, state in (metadata.get("callbacks") or {}).items():
        if not (str(name).startswith("ModelCheckpoint") and isinstance(state, Mapping)):
            continue
        best, score = state.get("best_model_path"), state.get("best_model_score")
        if state.get("monitor") and best and score is not None and Path(best).resolve() == Path(ckpt_path).resolve():
            return ExportedCheckpoint("best", step, str(state["monitor"]), float(score))
    return ExportedCheckpoint("last", step)


def export_checkpoint(
    module: SkipLM,
    output_dir: str,
    ckpt_path: str | None = None,
    datamodule: SkipDataModule | None = None,
    weights_only: bool | None = None,
    adapter_only: bool = False,
    overwrite: bool = False,
    draft_vocab_size: int | None = None,
) -> Path:
    """Export a run's checkpoint (or the configured module alone) with its record; see ``skiptrain export``.

    The target is checked before any weights are loaded. A module whose model is built here has its LoRA adapters
    merged in place (no copy). With ``draft_vocab_size`` N the export records the N most frequent target tokens of
    ``datamodule``'s training split as its draft vocabulary (:mod:`skiptrain.data.draft_vocab`).

    Returns:
        The export directory.
    """
    check_output_dir(output_dir, overwrite)
    if draft_vocab_size is not None:  # the model's vocabulary size, before any weights load
        vocab_size = (module.check_model() or module.model.config).vocab_size
        check_draft_vocab_size(draft_vocab_size, vocab_size)
        if datamodule is None:
            raise UsageError(f"draft_vocab_size={draft_vocab_size} needs the run's data (--data or its --config): "
                             "its training targets are counted; allowed null without data")
    fresh = module.model is None
    if adapter_only and fresh and (module.lora is None or module.source.kind == "export"):
        raise ExportUsageError(ADAPTER_ONLY_NEEDS_LORA)  # known before any weights are loaded
    weights = module.load_weights(ckpt_path, weights_only)
    record = checkpoint_record(weights, ckpt_path, module, datamodule, weights_only)
    if draft_vocab_size is not None:
        record = dataclasses.replace(record, draft_vocab=frequent_target_tokens(datamodule, draft_vocab_size,
                                                                                vocab_size))
    return export_module(module, output_dir, record, adapter_only=adapter_only, overwrite=overwrite, in_place=fresh)


def recorded_prompt_format(
    module: SkipLM, ckpt_path: str | None, datamodule: SkipDataModule | None = None, weights_only: bool | None = None
) -> PromptFormat | None:
    """How the run behind ``module`` made its prompts, read without loading weights: an export's recorded format,
    else the configured data module's, else the one stored in ``ckpt_path``'s data hyperparameters (``None``: the
    model records none)."""
    if module.model is None and is_export(module.model_name):
        return read_record(module.model_name).prompt_format
    if datamodule is not None:
        return datamodule.prompt_format
    if ckpt_path and checkpoint_layout(ckpt_path) == "file":
        return stored_prompt_format(checkpoint_metadata(ckpt_path, weights_only).get("datamodule_hyper_parameters"))
    return None


def export_module(
    module: SkipLM,
    output_dir: str | os.PathLike,
    record: ExportRecord,
    adapter_only: bool = False,
    overwrite: bool = False,
    in_place: bool = False,
) -> Path:
    """Export a configured :class:`~skiptrain.training.module.SkipLM` (its model, tokenizer and schedule); see
    :func:`~skiptrain.export.write.write_export`."""
    if module.model is None or module.schedule is None:
        raise ExportError("the module has no model yet: call configure_model() (or load a checkpoint) first")
    return write_export(module.model, module.get_tokenizer(), module.schedule, output_dir, record,
                        adapter_only=adapter_only, overwrite=overwrite, in_place=in_place)


# -- run files -------------------------------------------------------------------------------------------------------
def find_run_file(ckpt_path: str | os.PathLike, name: str) -> Path | None:
    """A file of the run beside a checkpoint: in its folder or the log dir above it (``.../checkpoints/x.ckpt``)."""
    path = Path(ckpt_path).resolve()
    for folder in (path.parent, path.parent.parent):
        if (folder / name).is_file():
            return folder / name
    return None


def validation_metrics_from_csv(path: str | os.PathLike, max_step: int | None = None) -> dict[str, float]:
    """The last logged value of every ``val/`` metric in a CSVLogger ``metrics.csv`` (up to ``max_step``)."""
    metrics: dict[str, float] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = row.get("step")
            if max_step is not None and step not in (None, "") and int(float(step)) > max_step:
                continue
            for key, value in row.items():
                if key and key.startswith(VALIDATION_PREFIX) and value not in (None, ""):
                    metrics[key] = float(value)
    return metrics


def validation_metrics_from_checkpoint(
    ckpt_path: str | os.PathLike, metadata: Mapping[str, Any]
) -> tuple[dict[str, float], str]:
    """Validation metrics of the run that wrote a checkpoint, and where they were found.

    The run's ``metrics.csv`` beside the checkpoint (values logged up to the checkpoint's step), completed by the
    monitored score that ``ModelCheckpoint`` stored in the checkpoint.
    """
    metrics, sources = {}, []
    csv_path = find_run_file(ckpt_path, RUN_METRICS_FILE)
    if csv_path is not None:
        metrics = validation_metrics_from_csv(csv_path, metadata.get("global_step"))
        sources.append(f"the run's {RUN_METRICS_FILE}")
    for name, state in (metadata.get("callbacks") or {}).items():
        if not (str(name).startswith("ModelCheckpoint") and isinstance(state, Mapping)):
            continue
        monitor, score = state.get("monitor"), state.get("best_model_score")
        if monitor and score is not None and monitor not in metrics:
            metrics[str(monitor)] = float(score)
            sources.append("the checkpoint's ModelCheckpoint state")
    return metrics, " and ".join(sources) or NOT_RECORDED


def _plain(value: Any) -> Any:
    """Hyperparameters as YAML-safe data (dataclass schedules become ``class_path``/``init_args``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        args = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"class_path": f"{type(value).__module__}.{type(value).__qualname__}", "init_args": args}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def hyperparameters_yaml(model_hparams: Mapping[str, Any], data_hparams: Mapping[str, Any] | None) -> str:
    """A training config reconstructed from stored hyperparameters (when the run's ``config.yaml`` is absent)."""
    config = {"model": _plain(model_hparams)}
    if data_hparams:
        config["data"] = _plain(data_hparams)
    header = "# Reconstructed from the checkpoint's hyperparameters: the run's config.yaml was not found.\n"
    return header + yaml.safe_dump(config, sort_keys=False)


__all__ = [
    "RUN_CONFIG_FILE",
    "RUN_METRICS_FILE",
    "best_checkpoint",
    "checkpoint_record",
    "export_checkpoint",
    "find_run_file",
    "fit_record",
    "hyperparameters_yaml",
    "recorded_prompt_format",
    "run_record",
    "validation_metrics_from_checkpoint",
    "validation_metrics_from_csv",
]
