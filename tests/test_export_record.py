"""The export record and the one verification path: a record round trips through an export, every defect of an
export has one outcome whether it is found when writing or when loading, and one key-diff report serves exports
and checkpoints alike."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

from skiptrain.core.key_diff import KeyDiff, diff_keys, list_names
from skiptrain.core.schedules import Dense, SkipDecode
from skiptrain.export.card import model_card
from skiptrain.export.format import (
    ADAPTER_CONFIG_FILE,
    CONFIG_FILE,
    CONFIG_KEY,
    SCHEDULE_FILE,
    ExportError,
    read_record,
)
from skiptrain.export.load import load_exported
from skiptrain.export.record import NOT_RECORDED, ExportRecord, producer
from skiptrain.export.verify import check_tensors, verify_export
from skiptrain.export.write import write_export
from skiptrain.modeling.loading import load_causal_lm, load_tokenizer
from skiptrain.training.checkpoints import CheckpointError, consolidate_checkpoint

RUN = dict(trained_with_schedule=False, task="builtin", training_config="model:\n  model: tiny\n",
           metrics={"val/loss_skip": 1.5}, metrics_source="a test")


@pytest.fixture(scope="module")
def exports(tiny_model_dir, tmp_path_factory):
    """A merged-weights and an adapter-only export of a tiny 4-layer llama, with their record."""
    model_dir = tiny_model_dir("llama")
    model, tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    schedule = SkipDecode(min_layers=2, decay_tokens=6).build(4)
    root = tmp_path_factory.mktemp("exports")
    record = ExportRecord(model_dir, **RUN)
    write_export(model, tokenizer, schedule, root / "merged", record)
    adapted = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    write_export(adapted, tokenizer, schedule, root / "adapter", record, adapter_only=True)
    return {"merged": root / "merged", "adapter": root / "adapter", "record": record, "schedule": schedule}


# -- the record --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["merged", "adapter"])
def test_record_round_trips_through_an_export(exports, kind):
    written = dataclasses.replace(exports["record"], schedule=exports["schedule"], producer=producer())
    expected = dataclasses.replace(written, task=None, metrics={}, metrics_source=NOT_RECORDED)  # card only
    assert read_record(exports[kind]) == expected
    assert verify_export(exports[kind]) == expected
    assert load_exported(exports[kind]).record == expected
    # the file is exactly the record's schedule_json (the format is the schedule's keys plus four run keys)
    text = (exports[kind] / SCHEDULE_FILE).read_text()
    assert text == written.schedule_json() + "\n"
    assert set(json.loads(text)) == set(exports["schedule"].to_dict()) | {"producer", "trained_with_schedule",
                                                                          "base_model", "base_quantization"}
    card = (exports[kind] / "README.md").read_text()
    assert "Task: builtin" in card and "| val/loss_skip | 1.5 |" in card and "Source: a test." in card
    assert f"over {exports['schedule'].span} generated tokens" in card


def test_the_card_is_a_hub_model_card_with_the_runs_metadata(exports):
    card = ModelCard.load(exports["merged"] / "README.md")
    assert card.data.base_model == exports["record"].base_model and card.data.pipeline_tag == "text-generation"
    assert {"skiptrain", "skip-decoding"} <= set(card.data.tags) and card.data.datasets is None  # builtin: no Hub data
    assert card.text.lstrip().startswith("# skiptrain export")
    schedule = exports["schedule"]
    hub_data = ExportRecord("x", task="xsum", schedule=schedule)
    assert ModelCard(model_card(hub_data)).data.datasets == ["EdinburghNLP/xsum"]
    own_data = dataclasses.replace(hub_data, training_config="data:\n  dataset_id: someone/weather\n")
    assert ModelCard(model_card(own_data)).data.datasets == ["someone/weather"]


def test_a_bundled_base_is_recorded_by_its_hub_id_and_still_loads_by_its_name(exports):
    record = dataclasses.replace(exports["record"], base_model="smollm2-135m-instruct", schedule=exports["schedule"])
    written = json.loads(record.schedule_json())
    assert written["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert written["base_model_source"] == "smollm2-135m-instruct"
    assert ExportRecord.from_schedule_file(exports["schedule"], written).base_model == "smollm2-135m-instruct"
    card = ModelCard(model_card(record))
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.license == "apache-2.0"
    assert "a de-quantised Q4_1 GGUF of SmolLM2-135M-Instruct" in card.text


def test_a_record_without_training_config_reads_back_without_one(plain, tmp_path):
    model, tokenizer, schedule, model_dir = plain
    write_export(model, tokenizer, schedule, tmp_path / "out", ExportRecord(model_dir))
    assert read_record(tmp_path / "out").training_config is None
    assert (tmp_path / "out" / "training_config.yaml").read_text() == f"# training config: {NOT_RECORDED}\n"


# -- one verification path -----------------------------------------------------------------------------------------
def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_tensors(path: Path, change) -> None:
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


DEFECTS = {
    "schedule_missing": ("merged", lambda d: (d / SCHEDULE_FILE).unlink(), "skip_schedule.json is missing"),
    "schedule_malformed": ("merged", lambda d: (d / SCHEDULE_FILE).write_text("{"), "is not valid JSON"),
    "schedule_version": ("merged", lambda d: _edit_json(d / SCHEDULE_FILE, lambda r: r.update(schema_version=2)),
                         "schema_version=2 is not supported"),
    "schedule_layers": ("merged", lambda d: (d / SCHEDULE_FILE).write_text(Dense().build(3).to_json(base_model="x")),
                        "skip_schedule.json: num_layers=3 of the schedule does not match the model's 4"),
    "mirror_differs": ("merged", lambda d: _edit_json(d / CONFIG_FILE, lambda c: c[CONFIG_KEY].update(producer="x")),
                       "config.json has a different 'skip_schedule' key"),
    "mirror_missing": ("merged", lambda d: _edit_json(d / CONFIG_FILE, lambda c: c.pop(CONFIG_KEY)),
                       "config.json has no 'skip_schedule' key"),
    "config_missing": ("merged", lambda d: (d / CONFIG_FILE).unlink(), "config.json is missing"),
    "tensor_missing": ("merged", lambda d: _edit_tensors(d / "model.safetensors", lambda t: t.pop("model.norm.weight")),
                       "1 missing: model.norm.weight"),
    "tensor_shape": ("merged", lambda d: _edit_tensors(d / "model.safetensors",
                                                       lambda t: t.update({"model.norm.weight": torch.ones(3)})),
                     r"model\.norm\.weight: \[3\] instead of \[32\]"),
    "tensor_empty": ("merged", lambda d: _edit_tensors(d / "model.safetensors",
                                                       lambda t: t.update({"model.norm.weight": torch.ones(0)})),
                     r"1 empty \(zero-element\): model\.norm\.weight"),
    "adapter_base_missing": ("adapter", lambda d: _edit_json(d / SCHEDULE_FILE, lambda r: r.pop("base_model")),
                             "base_model=None is invalid for an adapter-only export"),
    "adapter_tensor_missing": ("adapter", lambda d: _edit_tensors(
        d / "adapter_model.safetensors", lambda t: t.pop(sorted(t)[0])), "adapter in .* 1 missing"),
}


@pytest.mark.parametrize("defect", DEFECTS)
def test_each_defect_has_one_outcome_at_write_and_load_time(defect, exports, tmp_path):
    kind, breaking, message = DEFECTS[defect]
    broken = tmp_path / "export"
    shutil.copytree(exports[kind], broken)
    breaking(broken)
    if defect != "adapter_tensor_missing":  # checked against the peft model it is saved from or loaded into
        with pytest.raises(ExportError, match=message):
            verify_export(broken)  # what write_export runs on its staging directory
    with pytest.raises(ExportError, match=message):
        load_exported(broken)


def test_write_time_defects_are_refused_with_the_load_time_message(plain, tmp_path):
    model, tokenizer, schedule, model_dir = plain
    with pytest.raises(ExportError, match="num_layers=3 of the schedule does not match the model's 4"):
        write_export(model, tokenizer, Dense().build(3), tmp_path / "layers", ExportRecord(model_dir))
    model.model.norm.weight = torch.nn.Parameter(torch.ones(0))
    with pytest.raises(ExportError, match=r"1 empty \(zero-element\): model\.norm\.weight"):
        write_export(model, tokenizer, schedule, tmp_path / "empty", ExportRecord(model_dir))
    assert not any(tmp_path.iterdir()), "a refused export leaves nothing behind"


def test_adapter_export_has_no_config_mirror_and_is_verified_against_its_base(exports):
    assert (exports["adapter"] / ADAPTER_CONFIG_FILE).is_file() and not (exports["adapter"] / CONFIG_FILE).exists()
    assert verify_export(exports["adapter"]).base_model == exports["record"].base_model


@pytest.fixture
def plain(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    return load_causal_lm(model_dir), load_tokenizer(model_dir), SkipDecode(min_layers=2).build(4), model_dir


# -- one key-diff report -----------------------------------------------------------------------------------------------
def test_diff_keys_sorts_every_kind_of_difference():
    expected = {"a": (2, 3), "b": (4,), "c": (1,), "tied": (5,)}
    found = {"b": (0,), "c": (2,), "z": (1,), "y": (1,)}
    diff = diff_keys(found, expected, optional={"tied"})
    assert diff == KeyDiff(missing=("a",), unexpected=("y", "z"), empty=("b",), misshaped=("c: [2] instead of [1]",))
    assert diff.problems() == ["1 missing: a", "2 unexpected: y, z", "1 empty (zero-element): b",
                               "1 of the wrong shape: c: [2] instead of [1]"]
    assert diff_keys(expected, expected).problems() == []
    assert diff_keys({"e": (0,)}, {"e": (0,)}).problems() == []  # expected to be empty: not a placeholder
    assert list_names([f"k{i}" for i in range(23)]).endswith("k19 ... (3 more)")


def test_exports_and_checkpoints_report_key_differences_alike(tmp_path):
    reference = torch.nn.Linear(3, 2)
    state = {"weight": torch.ones(3, 3), "extra": torch.ones(1)}  # bias missing, weight mis-shaped
    torch.save({"state_dict": state}, tmp_path / "run.ckpt")
    phrase = "; ".join(diff_keys({k: v.shape for k, v in state.items()},
                                 {k: v.shape for k, v in reference.state_dict().items()}).problems())
    assert phrase == "1 missing: bias; 1 unexpected: extra; 1 of the wrong shape: weight: [3, 3] instead of [2, 3]"
    with pytest.raises(CheckpointError) as from_checkpoint:
        consolidate_checkpoint(tmp_path / "run.ckpt", reference=reference)
    with pytest.raises(ExportError) as from_export:
        check_tensors({k: tuple(v.shape) for k, v in state.items()},
                      {k: tuple(v.shape) for k, v in reference.state_dict().items()})
    assert str(from_checkpoint.value).endswith(phrase) and str(from_export.value).endswith(phrase)
