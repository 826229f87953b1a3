"""The model card (``README.md``) of an export: huggingface_hub's :class:`~huggingface_hub.ModelCard`, its metadata a
:class:`~huggingface_hub.ModelCardData` and its text the Jinja template ``model_card.md`` beside this module."""

from __future__ import annotations

import json
from importlib.resources import files

import yaml
from huggingface_hub import ModelCard, ModelCardData

from skiptrain.core.speedup import cost_summary
from skiptrain.export.format import CONFIG_FILE, CONFIG_KEY, CUSTOM_GENERATE_FILE, SCHEDULE_FILE, TRAINING_CONFIG_FILE
from skiptrain.export.record import NOT_RECORDED, ExportRecord
from skiptrain.modeling.loading import bundled_model
from skiptrain.modeling.quantization import Quantization
from skiptrain.shipped.prompt_format import PromptFormat
from skiptrain.text.tasks import TASKS

TEMPLATE = files("skiptrain.export").joinpath("model_card.md").read_text()
TAGS = ["skiptrain", "skip-decoding", "layer-skipping"]
"""The card's Hub tags."""


def card_data(record: ExportRecord) -> ModelCardData:
    """The card's metadata: base model (its Hub id), datasets, pipeline, license and tags."""
    bundled = bundled_model(record.base_model)
    return ModelCardData(
        base_model=record.base_model_id,
        datasets=_datasets(record),
        pipeline_tag="text-generation",
        library_name="transformers",
        license=bundled.license if bundled is not None else None,
        tags=TAGS,
    )


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
        f"The peft LoRA adapter alone; apply it to `{record.base_model}` (the base model, as skiptrain loads it)."
        if adapter_only
        else "Merged weights (safetensors): a plain Hugging Face model."
    )
    if record.base_quantization is not None:
        weights += f"\n- {_quantization_note(record, adapter_only)}"
    trained = "fine-tuned with the schedule in its forward pass" if record.trained_with_schedule else (
        "NOT fine-tuned with the schedule (the schedule was only attached)")
    card = ModelCard.from_template(
        card_data(record),
        template_str=TEMPLATE,
        base=_describe_base(record),
        task=record.task or NOT_RECORDED,
        weights=weights,
        family=schedule.family,
        params=json.dumps(schedule.params),
        trained=trained,
        weights_from=record.checkpoint.describe() if record.checkpoint else NOT_RECORDED,
        prompt_format=_describe_prompt_format(record.prompt_format),
        cost=cost_summary(schedule, [schedule.span]),
        producer=record.producer,
        description=schedule.describe(),
        picture=schedule.picture(4, max(schedule.span + 4, 8)),
        metrics=metrics,
        schedule_file=SCHEDULE_FILE,
        config_key=CONFIG_KEY,
        config_file=CONFIG_FILE,
        custom_generate_file=CUSTOM_GENERATE_FILE,
        training_config_file=TRAINING_CONFIG_FILE,
    )
    return str(card).rstrip("\n") + "\n"  # Jinja drops the template's final newline


def _describe_base(record: ExportRecord) -> str:
    """The base model, and for a bundled one what its weights are."""
    bundled = bundled_model(record.base_model)
    if bundled is None:
        return f"`{record.base_model_id}`"
    return (f"`{bundled.hub_id}`; the weights fine-tuned here are {bundled.describe()} (skiptrain's bundled "
            f"`{record.base_model}`)")


def _datasets(record: ExportRecord) -> list[str] | None:
    """The Hub dataset the run trained on: the training config's ``data.dataset_id``, else its task's default."""
    try:
        data = (yaml.safe_load(record.training_config or "") or {}).get("data") or {}
    except yaml.YAMLError:
        data = {}
    data = data.get("init_args", data) if isinstance(data, dict) else {}
    dataset_id = data.get("dataset_id")
    if dataset_id is None and record.task in TASKS:
        dataset_id = TASKS[record.task].dataset_id
    return [dataset_id] if isinstance(dataset_id, str) and dataset_id else None


def _describe_prompt_format(prompt_format: PromptFormat | None) -> str:
    if prompt_format is None:
        return f"{NOT_RECORDED} (prompts are used as given)"
    chat = (" inside the tokenizer's chat template" + (" after a system message" if prompt_format.system_message
                                                       else "")) if prompt_format.chat_template else ""
    return (f"the template {json.dumps(prompt_format.template)}{chat}, fields {list(prompt_format.fields)}, at most "
            f"{prompt_format.max_source_tokens} tokens (`prompt_format` in `{SCHEDULE_FILE}`); `skiptrain generate` "
            "and the custom generate (`sources=`) apply it to bare sources")


def _quantization_note(record: ExportRecord, adapter_only: bool) -> str:
    """The model card's line on a QLoRA run: what the adapter was trained on, and what the weights here are."""
    quantization = Quantization(**record.base_quantization)
    trained_on = f"QLoRA: the adapter was trained on the base quantized to {quantization.describe()} (bitsandbytes)"
    if adapter_only:
        return (f"{trained_on}; `load_exported` quantizes the base the same way and merges the adapter into its "
                "dequantized weights")
    return (f"{trained_on}; the merged weights are that base dequantized to float32 plus the adapter (no "
            "re-quantization), so they compute what the trained model did")
