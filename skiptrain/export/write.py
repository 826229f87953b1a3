"""Write exports of a fine-tuned model with its skip schedule, verify them, and load them back.

An export (the contract of ``docs/export-format.md``) is a normal Hugging Face model directory, loadable densely by
plain ``AutoModelForCausalLM.from_pretrained``, plus its :class:`~skiptrain.export.record.ExportRecord`:

- ``skip_schedule.json``: the schedule as layer lists (:meth:`~skiptrain.core.schedules.SkipSchedule.to_json`) with
  ``producer``, ``trained_with_schedule`` and ``base_model``; the same object is mirrored under the key
  ``skip_schedule`` in ``config.json``;
- ``training_config.yaml``: the resolved LightningCLI config of the run (or, when none is found, the model and
  data hyperparameters stored in the checkpoint);
- ``README.md``: a model card with the base model, task, schedule, ideal speedup and validation metrics;
- ``custom_generate/generate.py`` (merged weights only): :mod:`skiptrain.export.custom_generate`, which makes plain
  transformers ``generate()`` decode under the schedule when the export is loaded with ``trust_remote_code=True``.

With ``adapter_only`` the directory holds the peft adapter (``adapter_config.json``, ``adapter_model.safetensors``)
instead of merged weights; ``skip_schedule.json`` names the base model the adapter applies to.

Writing is all-or-nothing: everything goes to a temporary directory beside the target, is verified, and only
then renamed into place (:mod:`skiptrain.core.output_dir`). A failed export leaves neither the target nor the temporary
directory behind.
Verification (:func:`verify_export`) is the same when an export is written and when it is loaded: each defect
has one outcome, an :class:`ExportError` naming the file.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from skiptrain.core.key_diff import Shapes, diff_keys
from skiptrain.core.output_dir import check_output_dir, staged_directory
from skiptrain.core.schedules import ScheduleError, SkipSchedule
from skiptrain.core.speedup import cost_summary
from skiptrain.errors import InputError, UsageError
from skiptrain.export import custom_generate
from skiptrain.export.record import NOT_RECORDED, ExportRecord, producer
from skiptrain.modeling.loading import load_causal_lm, load_config, prepare_tokenizer
from skiptrain.text.prompt_format import PromptFormat

SCHEDULE_FILE = "skip_schedule.json"
CONFIG_FILE = "config.json"
CONFIG_KEY = "skip_schedule"
ADAPTER_CONFIG_FILE = "adapter_config.json"
TRAINING_CONFIG_FILE = "training_config.yaml"
MODEL_CARD_FILE = "README.md"
CUSTOM_GENERATE_FILE = "custom_generate/generate.py"
PROMPT_FORMAT_FILE = "prompt_format.py"  # beside CUSTOM_GENERATE_FILE, which imports it
UNRECORDED_TRAINING_CONFIG = f"# training config: {NOT_RECORDED}\n"


class ExportError(InputError):
    """An export cannot be written or an export directory cannot be used (the message says which file and why)."""


class ExportUsageError(ExportError, UsageError):
    """An export refused for its options: a non-empty ``output_dir``, ``adapter_only`` without LoRA, an export
    combined with a checkpoint."""

    exit_code = UsageError.exit_code


def is_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a ``skip_schedule.json``, or one written as an export that lost it.

    An export whose ``skip_schedule.json`` is gone still has its ``training_config.yaml`` (or the schedule's copy in
    ``config.json``): it counts as an export, so that loading it is refused (:func:`read_skip_schedule`) rather
    than decoding its weights under another schedule.
    """
    directory = Path(path)
    return (directory / SCHEDULE_FILE).is_file() or (directory / TRAINING_CONFIG_FILE).is_file()


def is_adapter_export(directory: str | os.PathLike) -> bool:
    """Whether an export holds a peft adapter (``adapter_config.json``) rather than merged weights."""
    return (Path(directory) / ADAPTER_CONFIG_FILE).is_file()


# -- reading the record ----------------------------------------------------------------------------------------------
def read_skip_schedule(directory: str | os.PathLike) -> tuple[SkipSchedule, dict[str, Any]]:
    """Read and validate an export's ``skip_schedule.json``.

    Returns:
        The schedule and the raw JSON object (what ``config.json`` must mirror).

    Raises:
        ExportError: naming the file when it is missing, is not valid JSON, or breaks the contract (unknown
            ``format`` or ``schema_version``, missing keys, layer lists that are not nested, ...).
    """
    path = Path(directory) / SCHEDULE_FILE
    if not path.is_file() and (Path(directory) / TRAINING_CONFIG_FILE).is_file():
        raise ExportError(
            f"{path} is missing: {directory} was written as a skiptrain export ({TRAINING_CONFIG_FILE}) but has lost "
            f"its schedule, so its weights would decode under one they were not trained for; restore {SCHEDULE_FILE} "
            f"(config.json of merged weights keeps a copy under '{CONFIG_KEY}') or export again"
        )
    if not path.is_file():
        raise ExportError(
            f"{path} is missing: {directory} is not a skiptrain export (every export has {SCHEDULE_FILE}; "
            "write one with `skiptrain export`)"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ExportError(f"{path} is not valid JSON: {err}") from err
    try:
        return SkipSchedule.from_dict(raw), raw
    except ScheduleError as err:
        raise ExportError(f"{path} is not a valid skip schedule: {err}") from err


def read_record(directory: str | os.PathLike) -> ExportRecord:
    """The :class:`~skiptrain.export.record.ExportRecord` of an export, unverified (see :func:`verify_export`).

    Raises:
        ExportError: as :func:`read_skip_schedule`.
    """
    schedule, raw = read_skip_schedule(directory)
    return ExportRecord.from_schedule_file(schedule, raw, _training_config(Path(directory)))


def _training_config(directory: Path) -> str | None:
    path = directory / TRAINING_CONFIG_FILE
    text = path.read_text() if path.is_file() else None
    return None if text == UNRECORDED_TRAINING_CONFIG else text


# -- checks ----------------------------------------------------------------------------------------------------------
def check_schedule_fits(schedule: SkipSchedule, num_layers: int, where: str | os.PathLike) -> None:
    """Refuse a schedule whose ``num_layers`` disagrees with the model's decoder layer count, naming ``where``."""
    try:
        schedule.check_num_layers(num_layers)
    except ScheduleError as err:
        raise ExportError(f"{where}: {err}") from err


def saved_tensor_shapes(directory: str | os.PathLike, prefix: str = "model") -> dict[str, tuple[int, ...]]:
    """Names and shapes of the tensors in a directory's ``<prefix>*.safetensors`` files (headers only, no data).

    Raises:
        ExportError: naming the directory when it has no such file, or a file that is truncated or corrupt.
    """
    files = sorted(Path(directory).glob(f"{prefix}*.safetensors"))
    if not files:
        raise ExportError(f"{directory} has no {prefix}*.safetensors: its weights are missing; copy them back or "
                          "export again")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        except (OSError, SafetensorError) as err:
            raise ExportError(f"{file} is truncated or corrupt ({err}): copy it again or export again") from err
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
    saved: Shapes, expected: Shapes, optional: set[str] | frozenset[str] = frozenset(), where: str = "export"
) -> None:
    """Refuse saved tensors whose names, shapes or sizes differ from the expected ones.

    Args:
        saved: Name -> shape of what was written.
        expected: Name -> shape the architecture needs.
        optional: Expected names that may be absent (tied copies).
        where: What was written, for the message.

    Raises:
        ExportError: naming every missing, unexpected, empty or mis-shaped tensor (see
            :func:`~skiptrain.core.key_diff.diff_keys`).
    """
    problems = ([] if saved else ["no tensors were written"]) + diff_keys(saved, expected, optional).problems()
    if problems:
        raise ExportError(f"{where} failed the tensor check: " + "; ".join(problems))


def check_exported_weights(directory: str | os.PathLike, config: PretrainedConfig | None = None) -> None:
    """Check a directory's safetensors against its architecture (``config``, default its ``config.json``)."""
    expected, tied = expected_tensor_shapes(config or AutoConfig.from_pretrained(directory))
    check_tensors(saved_tensor_shapes(directory), expected, tied, where=f"weights in {directory}")


def check_exported_adapter(directory: str | os.PathLike, model: PeftModel) -> None:
    """Check an adapter-only export's tensors against the adapter of ``model`` (the one saved or loaded)."""
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}  # peft saves these keys
    check_tensors(saved_tensor_shapes(directory, prefix="adapter_model"), expected, where=f"adapter in {directory}")


def _merged_config(directory: Path) -> PretrainedConfig:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise ExportError(f"{path} is missing: an export of merged weights has {CONFIG_FILE} (an adapter-only "
                          f"export has {ADAPTER_CONFIG_FILE})")
    try:
        return AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as err:
        raise ExportError(f"{path} is not a readable model config: {err}") from err


def _check_mirror(directory: Path, schedule_object: Mapping[str, Any]) -> None:
    path = directory / CONFIG_FILE
    mirrored = json.loads(path.read_text()).get(CONFIG_KEY)
    if mirrored != schedule_object:
        state = "has no" if mirrored is None else "has a different"
        raise ExportError(f"{path} {state} '{CONFIG_KEY}' key: allowed only an exact copy of "
                          f"{directory / SCHEDULE_FILE}")


def verify_export(directory: str | os.PathLike) -> ExportRecord:
    """Check an export against its contract, when it is written and when it is loaded alike.

    Each defect is refused with an :class:`ExportError` naming the file, checked in this order:
    ``skip_schedule.json`` missing, not JSON or not a valid schedule; an adapter-only export without
    ``base_model``; the schedule's ``num_layers`` differing from the architecture's decoder layers (``config.json``,
    or the base model's for an adapter); and, for merged weights, a missing or unreadable ``config.json``, a
    ``config.json`` whose ``skip_schedule`` key is not an exact copy of ``skip_schedule.json``, and safetensors
    with missing, unexpected, empty or mis-shaped tensors. (An adapter's tensors are checked against the peft
    model they are saved from or loaded into: :func:`check_exported_adapter`.)

    Returns:
        The export's record.
    """
    directory = Path(directory)
    schedule, raw = read_skip_schedule(directory)
    record = ExportRecord.from_schedule_file(schedule, raw, _training_config(directory))
    adapter = is_adapter_export(directory)
    if adapter and not record.base_model:
        raise ExportError(f"{directory / SCHEDULE_FILE}: base_model={record.base_model!r} is invalid for an "
                          "adapter-only export: allowed the name of the model the adapter applies to")
    config = load_config(record.base_model) if adapter else _merged_config(directory)
    check_schedule_fits(schedule, config.num_hidden_layers, directory / SCHEDULE_FILE)
    if not adapter:
        _check_mirror(directory, raw)
        check_exported_weights(directory, config)
    return record


# -- writing ---------------------------------------------------------------------------------------------------------
def model_card(record: ExportRecord, adapter_only: bool = False) -> str:
    """The export's ``README.md``: base model, task, schedule, costs, validation metrics and how to load it."""
    schedule = record.schedule
    rows = [f"| {name} | {value:.4g} |" for name, value in sorted(record.metrics.items())]
    metrics = (
        "\n".join(["| metric | value |", "|---|---|", *rows]) + f"\n\nSource: {record.metrics_source}."
        if record.metrics
        else f"Validation metrics: {NOT_RECORDED}."
    )
    weights = (
        f"The peft LoRA adapter alone; apply it to `{record.base_model}` (the base model)."
        if adapter_only
        else "Merged weights (safetensors): a plain Hugging Face model."
    )
    trained = "fine-tuned with the schedule in its forward pass" if record.trained_with_schedule else (
        "NOT fine-tuned with the schedule (the schedule was only attached)")
    return f"""---
library_name: transformers
tags:
- skiptrain
- layer-skipping
---

# skiptrain export

- Base model: `{record.base_model}`
- Task: {record.task or NOT_RECORDED}
- Weights: {weights}
- Skip schedule: `{schedule.family}` {json.dumps(schedule.params)}, {trained}
- Weights from: {record.checkpoint.describe() if record.checkpoint else NOT_RECORDED}
- Prompt format: {_describe_prompt_format(record.prompt_format)}
- Decoder-layer cost over the schedule's span: {cost_summary(schedule, [schedule.span])}; the ideal speedup is
  decoder layers / mean executed decoder layers per generated token
- Produced by {record.producer}

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

Skip-aware with plain transformers (no skiptrain needed): `trust_remote_code=True` runs
`{CUSTOM_GENERATE_FILE}`, which decodes transformers' own `generate()` (greedy, sampling, beam search,
streamers, `pipeline("text-generation")`) under the schedule. Prompts must be left-padded:

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("path/to/this/export", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("path/to/this/export", padding_side="left")
batch = tokenizer(["..."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch, max_new_tokens=64), skip_special_tokens=True))
```

Skip-aware with skiptrain (batched, KV-cached):

```bash
python -m skiptrain generate --model.model path/to/this/export --prompts prompts.jsonl
```

```python
from skiptrain import generate, load_exported
model, schedule, tokenizer = load_exported("path/to/this/export")
```

The training configuration is in `{TRAINING_CONFIG_FILE}`.
"""


def _describe_prompt_format(prompt_format: PromptFormat | None) -> str:
    if prompt_format is None:
        return f"{NOT_RECORDED} (prompts are used as given)"
    chat = (" inside the tokenizer's chat template" + (" after a system message" if prompt_format.system_message
                                                       else "")) if prompt_format.chat_template else ""
    return (f"the template {json.dumps(prompt_format.template)}{chat}, fields {list(prompt_format.fields)}, at most "
            f"{prompt_format.max_source_tokens} tokens (`prompt_format` in `{SCHEDULE_FILE}`); `skiptrain generate` "
            "and the custom generate (`sources=`) apply it to bare sources")


def _merged_model(model: nn.Module, in_place: bool) -> nn.Module:
    """The plain transformers model with any LoRA adapters merged (a copy unless ``in_place``)."""
    if not isinstance(model, PeftModel):
        return model
    return (model if in_place else copy.deepcopy(model)).merge_and_unload()


def _write_weights(model: nn.Module, directory: Path, adapter_only: bool, in_place: bool) -> None:
    if adapter_only:
        if not isinstance(model, PeftModel):
            raise ExportUsageError("adapter_only=True needs a LoRA model (model.lora is null): export merged weights")
        model.save_pretrained(str(directory))
        check_exported_adapter(directory, model)
        return
    _merged_model(model, in_place).save_pretrained(str(directory))


def _write_record(directory: Path, record: ExportRecord, adapter_only: bool) -> None:
    """The record's files: ``skip_schedule.json`` (with, for merged weights, its ``config.json`` mirror and the
    custom generate that reads it), training config, model card."""
    text = record.schedule_json()
    (directory / SCHEDULE_FILE).write_text(text + "\n")
    if not adapter_only:
        path = directory / CONFIG_FILE
        config = json.loads(path.read_text())
        config[CONFIG_KEY] = json.loads(text)
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        write_custom_generate(directory)
    (directory / TRAINING_CONFIG_FILE).write_text(record.training_config or UNRECORDED_TRAINING_CONFIG)
    (directory / MODEL_CARD_FILE).write_text(model_card(record, adapter_only))


def write_custom_generate(directory: str | os.PathLike) -> Path:
    """Ship :mod:`skiptrain.export.custom_generate` as ``custom_generate/generate.py``, and beside it
    :mod:`skiptrain.text.prompt_format` which it imports: transformers' ``generate()`` with ``trust_remote_code=True``
    then decodes under the ``config.json`` schedule, without skiptrain installed."""
    target = Path(directory) / CUSTOM_GENERATE_FILE
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(custom_generate.__file__, target)
    shutil.copyfile(inspect.getfile(PromptFormat), target.parent / PROMPT_FORMAT_FILE)
    return target


def _num_layers(model: nn.Module) -> int:
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    return base.config.num_hidden_layers


def write_export(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    output_dir: str | os.PathLike,
    record: ExportRecord,
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
        record: What to record about the run; its ``schedule`` and ``producer`` are set to ``schedule`` and this
            skiptrain.
        adapter_only: Save the LoRA adapter alone instead of merged weights.
        overwrite: Replace a non-empty ``output_dir``.
        in_place: Merge LoRA adapters into ``model`` itself (it is consumed) instead of into a copy.

    Returns:
        The export directory.

    Raises:
        OutputDirError: for a refused target (:mod:`skiptrain.core.output_dir`).
        ExportError: for a schedule built for another layer count, a model without adapters and ``adapter_only``,
            or a failed :func:`verify_export`. Nothing is left behind on any failure.
    """
    target = check_output_dir(output_dir, overwrite)
    check_schedule_fits(schedule, _num_layers(model), f"the schedule to export with {type(model).__name__}")
    record = dataclasses.replace(record, schedule=schedule, producer=producer())
    with staged_directory(target, overwrite) as staging:
        _write_weights(model, staging, adapter_only, in_place)
        tokenizer.save_pretrained(str(staging))
        _write_record(staging, record, adapter_only)
        verify_export(staging)
    rank_zero_info(f"skiptrain: exported to {target} ({'adapter' if adapter_only else 'merged weights'}, schedule "
                   f"{schedule.family}: {cost_summary(schedule, [schedule.span])}, the schedule's span)")
    return target


# -- loading ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportedModel:
    """An export loaded for inference; unpacks as ``model, schedule, tokenizer``.

    Args:
        model: The causal LM in eval mode (adapters merged into the base for adapter-only exports).
        tokenizer: The export's tokenizer, left-padding.
        record: The export's record (schedule, ``base_model``, ``trained_with_schedule``, ...).
        path: The export directory.
    """

    model: nn.Module
    tokenizer: Any
    record: ExportRecord
    path: Path

    @property
    def schedule(self) -> SkipSchedule:
        """The schedule from ``skip_schedule.json``, checked against the model's layer count."""
        return self.record.schedule

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.schedule, self.tokenizer))


def load_exported(
    path: str | os.PathLike, attn_implementation: str = "sdpa", dtype: torch.dtype | None = None
) -> ExportedModel:
    """Load an export for skip-aware inference.

    The export is verified (:func:`verify_export`, as when it was written) before any weights are loaded.

    Args:
        path: The export directory (merged weights, or an adapter-only export whose base model is loadable).
        attn_implementation: ``sdpa`` or ``eager``.
        dtype: Weight dtype (default float32).

    Raises:
        ExportError: for any defect :func:`verify_export` refuses, or adapter tensors that do not fit the base.
    """
    from transformers import AutoTokenizer

    directory = Path(path)
    record = verify_export(directory)
    if is_adapter_export(directory):
        base = load_causal_lm(record.base_model, attn_implementation=attn_implementation, dtype=dtype)
        adapted = PeftModel.from_pretrained(base, str(directory))
        check_exported_adapter(directory, adapted)
        model = adapted.merge_and_unload()
    else:
        model = load_causal_lm(str(directory), attn_implementation=attn_implementation, dtype=dtype)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(directory)))
    return ExportedModel(model.eval(), tokenizer, record, directory)


__all__ = [
    "ExportError",
    "ExportedModel",
    "check_exported_weights",
    "check_tensors",
    "is_export",
    "load_exported",
    "read_record",
    "read_skip_schedule",
    "verify_export",
    "write_export",
]
