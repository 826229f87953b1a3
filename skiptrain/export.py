"""Export a fine-tuned model with its skip schedule, and load exports back.

An export (the contract of ``METHOD.md`` section 5) is a normal Hugging Face model directory, loadable densely by
plain ``AutoModelForCausalLM.from_pretrained``, plus:

- ``skip_schedule.json``: the schedule as layer lists (:meth:`~skiptrain.schedules.SkipSchedule.to_json`) with
  ``producer``, ``trained_with_schedule`` and ``base_model``; the same object is mirrored under the key
  ``skip_schedule`` in ``config.json``;
- ``training_config.yaml``: the resolved LightningCLI config of the run (or, when none is found, the model and
  data hyperparameters stored in the checkpoint);
- ``README.md``: a model card with the base model, task, schedule, ideal speedup and validation metrics.

With ``adapter_only`` the directory holds the peft adapter (``adapter_config.json``, ``adapter_model.safetensors``)
instead of merged weights; ``skip_schedule.json`` names the base model the adapter applies to.

Writing is all-or-nothing: everything goes to a temporary directory beside the target, is checked (tensor names,
shapes and sizes against the architecture built on the meta device; the schedule file read back), and only then
renamed into place. A failed export leaves neither the target nor the temporary directory behind.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from skiptrain.models import load_causal_lm, load_config, prepare_tokenizer
from skiptrain.schedules import ScheduleError, SkipSchedule

if TYPE_CHECKING:
    from skiptrain.module import SkipLM

SCHEDULE_FILE = "skip_schedule.json"
CONFIG_FILE = "config.json"
CONFIG_KEY = "skip_schedule"
ADAPTER_CONFIG_FILE = "adapter_config.json"
TRAINING_CONFIG_FILE = "training_config.yaml"
MODEL_CARD_FILE = "README.md"
RUN_CONFIG_FILE = "config.yaml"  # what LightningCLI's SaveConfigCallback writes into the run's log dir
RUN_METRICS_FILE = "metrics.csv"  # what CSVLogger writes into the run's log dir
NOT_RECORDED = "not recorded"
VALIDATION_PREFIX = "val/"


class ExportError(ValueError):
    """An export cannot be written or an export directory cannot be used (the message says which file and why)."""


def producer() -> str:
    """``"skiptrain <version>"``, the ``producer`` of every export."""
    try:
        return f"skiptrain {version('skiptrain')}"
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "skiptrain unknown"


# -- runs ----------------------------------------------------------------------------------------------------------
def find_run_file(ckpt_path: str | os.PathLike, name: str) -> Path | None:
    """A file of the run beside a checkpoint: in its folder or the log dir above it (``.../checkpoints/x.ckpt``)."""
    path = Path(ckpt_path).resolve()
    for folder in (path.parent, path.parent.parent):
        if (folder / name).is_file():
            return folder / name
    return None


# -- run metadata ----------------------------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class ExportInfo:
    """What an export records about the run that produced it.

    Args:
        base_model: Model the fine-tuning started from (hub id, directory, ``.gguf`` file or bundled name).
        trained_with_schedule: Whether the weights were fine-tuned with the schedule in the forward pass.
        task: Task name of the run's data module, if known.
        training_config: YAML text of the resolved training config, if known.
        metrics: Validation metrics (name -> value).
        metrics_source: Where ``metrics`` came from, or ``not recorded``.
    """

    base_model: str
    trained_with_schedule: bool = True
    task: str | None = None
    training_config: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_source: str = NOT_RECORDED


# -- the schedule file -----------------------------------------------------------------------------------------------
def schedule_record(schedule: SkipSchedule, base_model: str, trained_with_schedule: bool) -> dict[str, Any]:
    """The ``skip_schedule.json`` object of the export contract (``METHOD.md`` section 5)."""
    return json.loads(schedule_json(schedule, base_model, trained_with_schedule))


def schedule_json(schedule: SkipSchedule, base_model: str, trained_with_schedule: bool) -> str:
    """The text of ``skip_schedule.json``."""
    return schedule.to_json(producer=producer(), trained_with_schedule=trained_with_schedule, base_model=base_model)


def read_skip_schedule(directory: str | os.PathLike) -> tuple[SkipSchedule, dict[str, Any]]:
    """Read and validate an export's ``skip_schedule.json``.

    Returns:
        The schedule and the raw JSON object.

    Raises:
        ExportError: naming the file when it is missing, is not valid JSON, or breaks the contract (unknown
            ``format`` or ``schema_version``, missing keys, layer lists that are not nested, ...).
    """
    path = Path(directory) / SCHEDULE_FILE
    if not path.is_file():
        raise ExportError(
            f"{path} is missing: {directory} is not a skiptrain export (every export has {SCHEDULE_FILE}; "
            "write one with `skiptrain export`)"
        )
    text = path.read_text()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ExportError(f"{path} is not valid JSON: {err}") from err
    try:
        schedule = SkipSchedule.from_dict(raw)
    except ScheduleError as err:
        raise ExportError(f"{path} is not a valid skip schedule: {err}") from err
    return schedule, raw


def check_schedule_fits(schedule: SkipSchedule, num_layers: int, directory: str | os.PathLike) -> None:
    """Refuse a schedule whose ``num_layers`` disagrees with the model's decoder layer count, naming the file."""
    try:
        schedule.check_num_layers(num_layers)
    except ScheduleError as err:
        raise ExportError(f"{Path(directory) / SCHEDULE_FILE}: {err}") from err


def is_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a ``skip_schedule.json``."""
    return (Path(path) / SCHEDULE_FILE).is_file()


# -- tensor checks ---------------------------------------------------------------------------------------------------
def saved_tensor_shapes(directory: str | os.PathLike, prefix: str = "model") -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in a directory's ``<prefix>*.safetensors`` files (headers only, no data)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(directory).glob(f"{prefix}*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def expected_tensor_shapes(config: PretrainedConfig) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Tensors a checkpoint of this architecture holds, from the model built on the meta device (no memory).

    Returns:
        ``(shapes, tied)``: every state-dict tensor's shape, and the names of tied copies (e.g. ``lm_head.weight``
        with ``tie_word_embeddings``) that ``save_pretrained`` leaves out and ``from_pretrained`` re-ties.
    """
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    return shapes, set(getattr(model, "all_tied_weights_keys", None) or {})


def check_tensors(
    saved: Mapping[str, tuple[int, ...]],
    expected: Mapping[str, tuple[int, ...]],
    optional: set[str] | frozenset[str] = frozenset(),
    where: str = "export",
) -> None:
    """Refuse saved tensors whose names, shapes or sizes differ from the expected ones.

    Args:
        saved: Name -> shape of what was written.
        expected: Name -> shape the architecture needs.
        optional: Expected names that may be absent (tied copies).
        where: What was written, for the message.

    Raises:
        ExportError: naming every missing, unexpected, empty or mis-shaped tensor.
    """
    problems = []
    missing = sorted(set(expected) - set(saved) - set(optional))
    unexpected = sorted(set(saved) - set(expected))
    empty = sorted(k for k, s in saved.items() if math.prod(s) == 0 and math.prod(expected.get(k, s)) != 0)
    shapes = sorted(f"{k}: {list(saved[k])} instead of {list(expected[k])}" for k in set(saved) & set(expected)
                    if saved[k] != expected[k] and k not in empty)
    if not saved:
        problems.append("no tensors were written")
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("empty (zero-element)", empty),
                        ("of the wrong shape", shapes)):
        if keys:
            problems.append(f"{len(keys)} {label}: {', '.join(keys[:20])}{' ...' if len(keys) > 20 else ''}")
    if problems:
        raise ExportError(f"{where} failed the tensor check: " + "; ".join(problems))


def check_exported_weights(directory: str | os.PathLike) -> None:
    """Check a full export's safetensors against its ``config.json`` architecture (see :func:`check_tensors`)."""
    config = AutoConfig.from_pretrained(directory)
    expected, tied = expected_tensor_shapes(config)
    check_tensors(saved_tensor_shapes(directory), expected, tied, where=f"weights in {directory}")


def check_exported_adapter(directory: str | os.PathLike, model: PeftModel) -> None:
    """Check an adapter-only export's tensors against the adapter of the model that was saved."""
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}  # peft saves these keys
    check_tensors(saved_tensor_shapes(directory, prefix="adapter_model"), expected, where=f"adapter in {directory}")


# -- writing ---------------------------------------------------------------------------------------------------------
def model_card(schedule: SkipSchedule, info: ExportInfo, adapter_only: bool = False) -> str:
    """The export's ``README.md``: base model, task, schedule, costs, validation metrics and how to load it."""
    mean = schedule.mean_layers_per_token()
    metrics = (
        "\n".join(["| metric | value |", "|---|---|", *(f"| {k} | {v:.4g} |" for k, v in sorted(info.metrics.items()))])
        + f"\n\nSource: {info.metrics_source}."
        if info.metrics
        else f"Validation metrics: {NOT_RECORDED}."
    )
    weights = (
        f"The peft LoRA adapter alone; apply it to `{info.base_model}` (the base model)."
        if adapter_only
        else "Merged weights (safetensors): a plain Hugging Face model."
    )
    trained = "fine-tuned with the schedule in its forward pass" if info.trained_with_schedule else (
        "NOT fine-tuned with the schedule (the schedule was only attached)")
    return f"""---
library_name: transformers
tags:
- skiptrain
- layer-skipping
---

# skiptrain export

- Base model: `{info.base_model}`
- Task: {info.task or NOT_RECORDED}
- Weights: {weights}
- Skip schedule: `{schedule.family}` {json.dumps(schedule.params)}, {trained}
- Decoder layers: {schedule.num_layers}; mean executed layers per generated token (over the schedule's span of
  {schedule.span} tokens): {mean:.2f}; ideal decode speedup: {schedule.ideal_speedup():.2f}x (decoder layers only)
- Produced by {producer()}

## Skip schedule

{schedule.describe()}

Prompt columns `P`, then generated indices; `#` runs, `.` is skipped:

```
{schedule.picture(4, max(schedule.span + 4, 8))}
```

`{SCHEDULE_FILE}` (also under the key `{CONFIG_KEY}` in `{CONFIG_FILE}`) is the contract for inference front-ends:
prompts are left-padded to end at column `P`; prompt columns run `prompt_layers`; the token at generated index
`g` (column `P + g`) runs `executed_layers[g]` (the last entry for every later `g`).

## Validation metrics

{metrics}

## Use

Dense (every layer, plain transformers):

```python
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("path/to/this/export")
```

Skip-aware (batched, KV-cached):

```bash
python -m skiptrain generate --model.model path/to/this/export --prompts prompts.jsonl
```

```python
from skiptrain import generate, load_exported
model, schedule, tokenizer = load_exported("path/to/this/export")
```

The training configuration is in `{TRAINING_CONFIG_FILE}`.
"""


def _merged_model(model: nn.Module, in_place: bool) -> nn.Module:
    """The plain transformers model with any LoRA adapters merged (a copy unless ``in_place``)."""
    if not isinstance(model, PeftModel):
        return model
    return (model if in_place else copy.deepcopy(model)).merge_and_unload()


def _write_weights(model: nn.Module, directory: Path, adapter_only: bool, in_place: bool) -> None:
    if adapter_only:
        if not isinstance(model, PeftModel):
            raise ExportError("adapter_only=True needs a LoRA model (model.lora is null): export merged weights")
        model.save_pretrained(str(directory))
        check_exported_adapter(directory, model)
        return
    _merged_model(model, in_place).save_pretrained(str(directory))
    check_exported_weights(directory)


def _mirror_into_config(directory: Path, record: dict[str, Any]) -> None:
    path = directory / CONFIG_FILE
    config = json.loads(path.read_text())
    config[CONFIG_KEY] = record
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def check_target(output_dir: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse an output directory that exists and is not empty, unless ``overwrite``; refuse a file."""
    target = Path(output_dir)
    if target.exists() and not target.is_dir():
        raise ExportError(f"output_dir={str(target)!r} is a file, not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ExportError(
            f"output_dir={str(target)!r} exists and is not empty: choose another directory or pass overwrite=True "
            "(--overwrite true) to replace it"
        )
    return target


def _use_default_permissions(directory: Path) -> None:
    """Give a ``mkdtemp`` directory (created ``0700``) the permissions a plain ``mkdir`` would give it."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)


def _move_into_place(staging: Path, target: Path) -> None:
    """Rename the finished ``staging`` directory to ``target``, replacing an existing one only at the very end."""
    if not target.exists():
        os.replace(staging, target)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.replace(target, retired / target.name)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(retired / target.name, target)
        raise
    finally:
        shutil.rmtree(retired, ignore_errors=True)


def write_export(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    output_dir: str | os.PathLike,
    info: ExportInfo,
    adapter_only: bool = False,
    overwrite: bool = False,
    in_place: bool = False,
) -> Path:
    """Write an export directory, all or nothing.

    Args:
        model: The (possibly peft-wrapped) Hugging Face causal LM.
        tokenizer: Its tokenizer.
        schedule: The skip schedule it was trained with.
        output_dir: Target directory; must be absent or empty unless ``overwrite``.
        info: What to record about the run.
        adapter_only: Save the LoRA adapter alone instead of merged weights.
        overwrite: Replace a non-empty ``output_dir``.
        in_place: Merge LoRA adapters into ``model`` itself (it is consumed) instead of into a copy.

    Returns:
        The export directory.

    Raises:
        ExportError: for a refused target, a model without adapters and ``adapter_only``, or a failed tensor or
            schedule check. Nothing is left behind on any failure.
    """
    target = check_target(output_dir, overwrite)
    schedule.check_num_layers(_num_layers(model))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _use_default_permissions(staging)
        _write_weights(model, staging, adapter_only, in_place)
        tokenizer.save_pretrained(str(staging))
        record = schedule_record(schedule, info.base_model, info.trained_with_schedule)
        (staging / SCHEDULE_FILE).write_text(schedule_json(schedule, info.base_model, info.trained_with_schedule)
                                             + "\n")
        if not adapter_only:
            _mirror_into_config(staging, record)
        training_config = info.training_config or f"# training config: {NOT_RECORDED}\n"
        (staging / TRAINING_CONFIG_FILE).write_text(training_config)
        (staging / MODEL_CARD_FILE).write_text(model_card(schedule, info, adapter_only))
        verify_export(staging)
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    rank_zero_info(f"skiptrain: exported to {target} ({'adapter' if adapter_only else 'merged weights'}, schedule "
                   f"{schedule.family}, {schedule.mean_layers_per_token():.2f} layers per generated token)")
    return target


def verify_export(directory: str | os.PathLike) -> SkipSchedule:
    """Check an export's contract files: the schedule reads back, fits the model, and ``config.json`` mirrors it.

    Raises:
        ExportError: naming the file that is wrong.
    """
    directory = Path(directory)
    schedule, raw = read_skip_schedule(directory)
    config_path = directory / CONFIG_FILE
    if config_path.is_file():
        mirrored = json.loads(config_path.read_text()).get(CONFIG_KEY)
        if mirrored != raw:
            raise ExportError(f"{config_path}: the '{CONFIG_KEY}' key does not equal {directory / SCHEDULE_FILE}")
        config = AutoConfig.from_pretrained(directory)
    else:
        config = load_config(raw.get("base_model"))
    check_schedule_fits(schedule, config.num_hidden_layers, directory)
    return schedule


def _num_layers(model: nn.Module) -> int:
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    return base.config.num_hidden_layers


def export_module(
    module: SkipLM,
    output_dir: str | os.PathLike,
    info: ExportInfo,
    adapter_only: bool = False,
    overwrite: bool = False,
    in_place: bool = False,
) -> Path:
    """Export a configured :class:`~skiptrain.module.SkipLM` (its model, tokenizer and schedule); see
    :func:`write_export`."""
    if module.model is None or module.schedule is None:
        raise ExportError("the module has no model yet: call configure_model() (or load a checkpoint) first")
    return write_export(module.model, module.get_tokenizer(), module.schedule, output_dir, info,
                        adapter_only=adapter_only, overwrite=overwrite, in_place=in_place)


# -- loading ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportedModel:
    """An export loaded for inference; unpacks as ``model, schedule, tokenizer``.

    Args:
        model: The causal LM in eval mode (adapters merged into the base for adapter-only exports).
        schedule: The schedule from ``skip_schedule.json``, checked against the model's layer count.
        tokenizer: The export's tokenizer, left-padding.
        record: The raw ``skip_schedule.json`` object (``base_model``, ``trained_with_schedule``, ...).
        path: The export directory.
    """

    model: nn.Module
    schedule: SkipSchedule
    tokenizer: Any
    record: dict[str, Any]
    path: Path

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.schedule, self.tokenizer))


def load_exported(
    path: str | os.PathLike, attn_implementation: str = "sdpa", dtype: torch.dtype | None = None
) -> ExportedModel:
    """Load an export for skip-aware inference.

    The schedule file is read and checked against the model's decoder layer count before any weights are loaded.

    Args:
        path: The export directory (merged weights, or an adapter-only export whose base model is loadable).
        attn_implementation: ``sdpa`` or ``eager``.
        dtype: Weight dtype (default float32).

    Raises:
        ExportError: for a missing, malformed, unknown-version or mismatched ``skip_schedule.json``.
    """
    from transformers import AutoTokenizer

    directory = Path(path)
    schedule, record = read_skip_schedule(directory)
    adapter = (directory / ADAPTER_CONFIG_FILE).is_file()
    if adapter:
        base_name = record.get("base_model")
        if not base_name:
            raise ExportError(f"{directory / SCHEDULE_FILE}: an adapter-only export needs 'base_model'")
        check_schedule_fits(schedule, load_config(base_name).num_hidden_layers, directory)
        base = load_causal_lm(base_name, attn_implementation=attn_implementation, dtype=dtype)
        model = PeftModel.from_pretrained(base, str(directory)).merge_and_unload()
    else:
        config_path = directory / CONFIG_FILE
        check_schedule_fits(schedule, AutoConfig.from_pretrained(directory).num_hidden_layers, directory)
        mirrored = json.loads(config_path.read_text()).get(CONFIG_KEY) if config_path.is_file() else None
        if mirrored is not None and mirrored != record:
            rank_zero_warn(f"{config_path}: '{CONFIG_KEY}' differs from {directory / SCHEDULE_FILE}; using the latter")
        model = load_causal_lm(str(directory), attn_implementation=attn_implementation, dtype=dtype)
    check_schedule_fits(schedule, _num_layers(model), directory)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(directory)))
    return ExportedModel(model.eval(), schedule, tokenizer, record, directory)


__all__ = [
    "ExportError",
    "ExportInfo",
    "ExportedModel",
    "check_exported_weights",
    "check_tensors",
    "export_module",
    "load_exported",
    "read_skip_schedule",
    "write_export",
]
