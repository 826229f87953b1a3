"""Export and inference: round trips through plain transformers and skiptrain, the schedule file as the contract,
every refusal, all-or-nothing writing, and the export / generate / evaluate subcommands."""

from __future__ import annotations

import copy
import io
import json
import shutil
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from helpers.cli_args import tiny_args
from helpers.exports import EXPORT_CALLBACK, PROMPTS, Run, left_padded, minimal_decode
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from skiptrain import Dense, SkipSchedule, load_exported, skip_forward
from skiptrain.cli.app import main
from skiptrain.cli.trainer import SkipTrainer
from skiptrain.core.output_dir import OutputDirError
from skiptrain.core.schedules import Ranked, SkipDecode
from skiptrain.export.format import CONFIG_KEY, SCHEDULE_FILE, ExportError, schedule_from_export
from skiptrain.export.record import ExportRecord
from skiptrain.export.verify import check_exported_weights, check_tensors
from skiptrain.export.write import write_export
from skiptrain.frontends.prompts import read_prompts
from skiptrain.modeling.loading import load_causal_lm, load_tokenizer
from skiptrain.training.checkpoints import CheckpointError, consolidate_checkpoint
from skiptrain.training.module import SkipLM

CONTRACT_KEYS = {"format", "schema_version", "producer", "num_layers", "family", "params", "position",
                 "prompt_layers", "executed_layers", "nested", "mean_layers_per_token", "trained_with_schedule",
                 "base_model"}





@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """``trained(family)``: fit a tiny model with LoRA for one epoch (2 steps) with ``ExportCallback``; cached."""
    runs = {}

    def run(family: str) -> Run:
        if family not in runs:
            root = tmp_path_factory.mktemp(f"run_{family}")
            model_dir, export_dir = tiny_model_dir(family), root / "export"
            cli = main(["fit", *tiny_args(
                model_dir, root / "fit", "--data.task", "builtin", "--data.max_train_samples", "8",
                "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}", "--model.optimizer.learning_rate", "0.02",
                "--model.generation.num_batches", "0", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1",
                "--seed_everything", "1", f"--trainer.callbacks+={EXPORT_CALLBACK % export_dir}",
            )])
            runs[family] = Run(cli, model_dir, root / "fit", export_dir)
        return runs[family]

    return run


def with_continuation(ids: torch.Tensor, mask: torch.Tensor, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Append ``length`` fixed tokens to a left-padded batch (columns past ``P`` run the executed sets)."""
    tail = torch.arange(10, 10 + length).repeat(ids.shape[0], 1)
    return torch.cat([ids, tail], 1), torch.cat([mask, torch.ones_like(tail)], 1)


# -- round trips -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "opt", "gpt2", "qwen3", "gemma2", "gemma3_text", "phi3"])
def test_round_trip_through_plain_transformers_and_skiptrain(family, trained):
    run = trained(family)
    module = run.cli.model
    tokenizer = load_tokenizer(run.model_dir)
    prompt_ids, prompt_mask = left_padded(tokenizer, PROMPTS)
    ids, mask = with_continuation(prompt_ids, prompt_mask)
    prompt_length = prompt_ids.shape[1]

    # dense: plain transformers on the export == the trained model with its adapters merged (bit for bit)
    merged = copy.deepcopy(module.model).merge_and_unload().eval()
    plain = AutoModelForCausalLM.from_pretrained(run.export_dir).eval()
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids, attention_mask=mask).logits,
                           merged(input_ids=ids, attention_mask=mask).logits)
        base = load_causal_lm(run.model_dir).eval()
        assert not torch.allclose(plain(input_ids=ids, attention_mask=mask).logits,
                                  base(input_ids=ids, attention_mask=mask).logits), "the adapters changed nothing"

    # skip-aware: skiptrain's loader gives the training schedule and the training forward's logits
    exported = load_exported(run.export_dir)
    assert exported.schedule == module.schedule
    with torch.no_grad():
        loaded = skip_forward(exported.model, ids, mask, exported.schedule, prompt_length)
        training = skip_forward(module.model.eval(), ids, mask, module.schedule, prompt_length)
        dense = skip_forward(exported.model, ids, mask, Dense().build(4), prompt_length)
    torch.testing.assert_close(loaded, training, atol=1e-5, rtol=0)
    assert not torch.allclose(loaded[:, prompt_length + 3:], dense[:, prompt_length + 3:]), "nothing was skipped"

    # the schedule file: the contract's keys, and config.json mirrors it exactly
    record = json.loads((run.export_dir / SCHEDULE_FILE).read_text())
    assert CONTRACT_KEYS <= set(record)
    assert record["format"] == "skiptrain.skip_schedule" and record["schema_version"] == 1
    assert record["producer"] == f"skiptrain {version('skiptrain')}"
    assert record["position"] == "generated_index" and record["nested"] is True
    assert record["trained_with_schedule"] is True and record["base_model"] == run.model_dir
    assert record["family"] == "skipdecode" and record["params"]["min_layers"] == 2
    assert record["executed_layers"] == [list(s) for s in module.schedule.executed_layers_table]
    assert json.loads((run.export_dir / "config.json").read_text())[CONFIG_KEY] == record

    # tokenizer, training config and model card
    saved_tokenizer = AutoTokenizer.from_pretrained(run.export_dir)
    assert saved_tokenizer("Forecast:")["input_ids"] == tokenizer("Forecast:")["input_ids"]
    assert (run.export_dir / "training_config.yaml").read_text() == run.config.read_text()
    card = (run.export_dir / "README.md").read_text()
    speedup = module.schedule.sequence_ideal_speedup()
    for expected in (f"Base model: `{run.model_dir}`", "Task: builtin", module.schedule.describe(),
                     module.schedule.picture(4, 11), f"ideal decode speedup: {speedup:.2f}x", "| val/loss_skip |"):
        assert expected in card


def test_export_subcommand_from_a_checkpoint_matches_the_callback_export(trained, tmp_path):
    run = trained("llama")
    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    main(["export", "--config", str(run.config), "--ckpt_path", str(run.checkpoint), "--output_dir", str(merged_dir)])
    # the epoch-end checkpoint holds the final weights: the same tensors as the callback's export
    exported, reference = load_file(merged_dir / "model.safetensors"), load_file(run.export_dir / "model.safetensors")
    assert exported.keys() == reference.keys()
    assert all(torch.equal(exported[k], reference[k]) for k in reference)
    assert (merged_dir / SCHEDULE_FILE).read_text() == (run.export_dir / SCHEDULE_FILE).read_text()
    card = (merged_dir / "README.md").read_text()
    assert "Source: the run's metrics.csv" in card and "| val/loss_skip |" in card

    # adapter-only, with no config at all: the checkpoint's hyperparameters configure the model
    main(["export", "--model.model", run.model_dir, "--ckpt_path", str(run.checkpoint), "--adapter_only", "true",
          "--output_dir", str(adapter_dir)])
    assert (adapter_dir / "adapter_model.safetensors").is_file() and not (adapter_dir / "config.json").exists()
    assert "Task: builtin" in (adapter_dir / "README.md").read_text()
    tokenizer = load_tokenizer(run.model_dir)
    ids, mask = with_continuation(*left_padded(tokenizer, PROMPTS))
    from_adapter, from_merged = load_exported(adapter_dir), load_exported(merged_dir)
    assert from_adapter.schedule == from_merged.schedule
    with torch.no_grad():
        torch.testing.assert_close(from_adapter.model(input_ids=ids, attention_mask=mask).logits,
                                   from_merged.model(input_ids=ids, attention_mask=mask).logits, atol=1e-5, rtol=0)


# -- the schedule file is the contract -------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
def test_skip_schedule_json_alone_reproduces_generate(family, trained, tmp_path):
    run = trained(family)
    prompts, output = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "id": i}) + "\n" for i, p in enumerate(PROMPTS)))
    common = ["--model.model", str(run.export_dir), "--prompts", str(prompts), "--max_new_tokens", "10",
              "--batch_size", "3", "--trainer.accelerator", "cpu", "--trainer.logger", "false",
              "--raw_prompts", "true"]  # whole prompts, tokenised as given
    main(["generate", *common, "--output", str(output)])
    results = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["prompt"] for r in results] == PROMPTS
    assert all(r["num_tokens"] == len(r["token_ids"]) for r in results)

    # nothing but the file's layer lists, a plain transformers model and its tokenizer
    record = json.loads((run.export_dir / SCHEDULE_FILE).read_text())
    schedule = SkipSchedule(record["num_layers"], tuple(record["prompt_layers"]),
                            tuple(tuple(s) for s in record["executed_layers"]))
    model = AutoModelForCausalLM.from_pretrained(run.export_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(run.export_dir, padding_side="left")
    ids, mask = left_padded(tokenizer, PROMPTS)
    decoded = minimal_decode(model, ids, mask, schedule, 10, tokenizer.eos_token_id)
    assert [r["token_ids"] for r in results] == decoded

    # --dense ignores the schedule: the same loop with every layer
    main(["generate", *common, "--output", str(output), "--dense", "true"])
    dense_results = [json.loads(line)["token_ids"] for line in output.read_text().splitlines()]
    assert dense_results != decoded, "these prompts decode differently when the schedule skips layers"
    assert dense_results == minimal_decode(model, ids, mask, Dense().build(record["num_layers"]), 10,
                                           tokenizer.eos_token_id)


def test_generate_reads_stdin_writes_stdout_and_measures_against_dense(trained, tmp_path, monkeypatch, capsys):
    run = trained("llama")
    capsys.readouterr()  # what the fixture's fit printed
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)))
    # bf16-mixed: every batch (2 here) decodes under the precision plugin's autocast
    trainer = SkipTrainer(accelerator="cpu", precision="bf16-mixed", logger=False, enable_progress_bar=False)
    report = trainer.generate(SkipLM(str(run.export_dir)), max_new_tokens=9, batch_size=2, compare_dense=True)
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == PROMPTS  # stdout carries only the JSON lines
    schedule = schedule_from_export(run.export_dir)[0]
    executed = sum(len(schedule.executed_layers(g)) for c in report.completions for g in range(c.num_tokens))
    assert report.stats.num_tokens == sum(c.num_tokens for c in report.completions)
    assert report.stats.mean_layers_per_token == pytest.approx(executed / report.stats.num_tokens)
    assert report.stats.mean_layers_per_token < 4
    assert report.comparison.dense.mean_layers_per_token == 4
    assert report.comparison.skip.lengths == report.comparison.dense.lengths == (9,) * len(PROMPTS)
    assert "measured speedup" in report.summary() and "parameter-read limit" in report.summary()


def test_read_prompts_formats_and_refusals(tmp_path):
    text = tmp_path / "prompts.txt"
    text.write_text("first prompt\n\nsecond prompt\n")
    assert read_prompts(str(text)) == ["first prompt", "second prompt"]
    assert read_prompts("-", io.StringIO('{"prompt": "a\\nb"}\n')) == ["a\nb"]
    bad = tmp_path / "bad.jsonl"
    for content, message in (('{"text": "x"}\n', "line 1: expected an object with a string 'prompt'"),
                             ('{"prompt": "x"}\n{oops\n', "line 2: not valid JSON"),
                             ('{"prompt": "  "}\n', "line 1: empty prompt"), ("\n", "no prompts")):
        bad.write_text(content)
        with pytest.raises(ValueError, match=message):
            read_prompts(str(bad))


def test_evaluate_scores_the_schedule_and_dense_in_one_table(trained, tmp_path):
    run = trained("llama")
    output = tmp_path / "eval.json"
    main(["evaluate", *tiny_args(str(run.export_dir), tmp_path / "eval", "--data.task", "builtin",
                                 "--data.max_eval_samples", "4", "--model.generation.max_new_tokens", "4"),
          "--output", str(output)])
    table = json.loads(output.read_text())
    assert set(table) == {"schedule", "dense"}
    for column in table.values():
        assert {"loss", "perplexity", "bleu", "mean_layers_per_token", "ideal_speedup"} <= set(column)
    assert table["schedule"]["loss"] != table["dense"]["loss"]
    assert table["dense"]["mean_layers_per_token"] == 4 and table["schedule"]["mean_layers_per_token"] < 4


# -- refusals --------------------------------------------------------------------------------------------------------
def _break_missing(path: Path) -> None:
    (path / SCHEDULE_FILE).unlink()


def _break_malformed(path: Path) -> None:
    (path / SCHEDULE_FILE).write_text('{"format": "skiptrain.skip_schedule", ')


def _break_version(path: Path) -> None:
    record = json.loads((path / SCHEDULE_FILE).read_text())
    (path / SCHEDULE_FILE).write_text(json.dumps({**record, "schema_version": 2}))


def _break_layers(path: Path) -> None:
    (path / SCHEDULE_FILE).write_text(Dense().build(3).to_json(producer="test", base_model="x"))


@pytest.mark.parametrize(("breaking", "message"), [
    (_break_missing, "skip_schedule.json is missing"),
    (_break_malformed, "skip_schedule.json is not valid JSON"),
    (_break_version, "schema_version=2 is not supported"),
    (_break_layers, "skip_schedule.json: num_layers=3 of the schedule does not match the model's 4"),
], ids=["missing", "malformed", "unknown_version", "layer_mismatch"])
def test_load_exported_refuses_a_broken_schedule_file(breaking, message, trained, tmp_path):
    broken = tmp_path / "export"
    shutil.copytree(trained("llama").export_dir, broken)
    breaking(broken)
    with pytest.raises(ExportError, match=message):
        load_exported(broken)


def test_generate_refuses_an_export_with_a_checkpoint(trained, tmp_path):
    run = trained("llama")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Forecast:\n")
    with pytest.raises(ExportError, match="is an export"):
        SkipTrainer(accelerator="cpu", logger=False).generate(SkipLM(str(run.export_dir)), prompts=str(prompts),
                                                              ckpt_path=str(run.checkpoint))


@pytest.fixture
def plain_model(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    return load_causal_lm(model_dir), load_tokenizer(model_dir), SkipDecode(min_layers=2).build(4), model_dir


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_export_refuses_a_non_empty_directory_unless_overwrite(plain_model, tmp_path):
    model, tokenizer, schedule, model_dir = plain_model
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    with pytest.raises(OutputDirError, match="exists and is not empty.*overwrite"):
        write_export(model, tokenizer, schedule, target, ExportRecord(model_dir))
    assert (target / "keep.txt").read_text() == "precious"
    write_export(model, tokenizer, schedule, target, ExportRecord(model_dir), overwrite=True)
    assert not (target / "keep.txt").exists() and (target / SCHEDULE_FILE).is_file()
    assert leftovers(tmp_path) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    write_export(model, tokenizer, schedule, empty, ExportRecord(model_dir))  # an empty directory is fine
    assert (empty / SCHEDULE_FILE).is_file()


def test_a_ranked_schedule_exports_with_its_ranking_and_loads_back(plain_model, tmp_path):
    model, tokenizer, _, model_dir = plain_model
    schedule = Ranked(min_layers=2, max_layers=3, decay_tokens=2, ranking=[0, 2, 1, 3]).build(4)
    write_export(model, tokenizer, schedule, tmp_path / "out", ExportRecord(model_dir))
    record = json.loads((tmp_path / "out" / SCHEDULE_FILE).read_text())
    assert record["family"] == "ranked" and record["params"]["ranking"] == [0, 2, 1, 3]
    loaded = load_exported(tmp_path / "out")
    assert loaded.schedule == schedule and loaded.schedule.params == schedule.params
    assert loaded.schedule.executed_layers(0) == (0, 1, 2) and loaded.schedule.executed_layers(2) == (0, 2)


def test_export_callback_refuses_a_non_empty_directory_before_training(tiny_model_dir, tmp_path, capsys):
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    with pytest.raises(SystemExit, match="2"):
        main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "fit", "--data.task", "builtin",
                                "--data.max_train_samples", "4", "--trainer.max_steps", "1",
                                f"--trainer.callbacks+={EXPORT_CALLBACK % target}")])
    assert "exists and is not empty" in capsys.readouterr().err
    assert not (tmp_path / "fit").exists()  # not even the run's config


def test_adapter_only_needs_lora(plain_model, tmp_path):
    model, tokenizer, schedule, model_dir = plain_model
    with pytest.raises(ExportError, match="adapter_only=True needs a LoRA model"):
        write_export(model, tokenizer, schedule, tmp_path / "out", ExportRecord(model_dir), adapter_only=True)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_interrupted_export_leaves_nothing_and_keeps_the_old_export(plain_model, tmp_path, monkeypatch):
    model, tokenizer, schedule, model_dir = plain_model
    old = tmp_path / "old"
    write_export(model, tokenizer, schedule, old, ExportRecord(model_dir))
    before = sorted(p.name for p in old.iterdir())

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(type(tokenizer), "save_pretrained", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        write_export(model, tokenizer, schedule, tmp_path / "new", ExportRecord(model_dir))
    with pytest.raises(RuntimeError, match="disk full"):
        write_export(model, tokenizer, schedule, old, ExportRecord(model_dir), overwrite=True)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in old.iterdir()) == before
    assert leftovers(tmp_path) == []


def test_export_with_an_empty_tensor_fails_and_leaves_nothing(plain_model, tmp_path):
    model, tokenizer, schedule, model_dir = plain_model
    model.model.layers[1].mlp.down_proj.weight = torch.nn.Parameter(torch.empty(32, 0))
    with pytest.raises(ExportError, match=r"empty \(zero-element\): model\.layers\.1\.mlp\.down_proj\.weight"):
        write_export(model, tokenizer, schedule, tmp_path / "out", ExportRecord(model_dir))
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_tensor_check_names_the_offending_keys(tiny_model_dir, tmp_path):
    expected = {"a.weight": (2, 3), "b.weight": (4,), "lm_head.weight": (5, 2)}
    check_tensors({"a.weight": (2, 3), "b.weight": (4,)}, expected, optional={"lm_head.weight"})  # tied: may be absent
    for saved, message in (
        ({"a.weight": (2, 3)}, "1 missing: b.weight"),
        ({**expected, "c.weight": (1,)}, "1 unexpected: c.weight"),
        ({**expected, "b.weight": (0,)}, r"1 empty \(zero-element\): b.weight"),
        ({**expected, "a.weight": (3, 2)}, r"of the wrong shape: a.weight: \[3, 2\] instead of \[2, 3\]"),
        ({}, "no tensors were written"),
    ):
        with pytest.raises(ExportError, match=message):
            check_tensors(saved, expected, optional={"lm_head.weight"})

    # on a saved directory, against the architecture built on the meta device (gpt2 ties lm_head to wte)
    for family, dropped in (("gpt2", "transformer.h.0.attn.c_attn.weight"), ("llama", "lm_head.weight")):
        directory = tmp_path / family
        shutil.copytree(tiny_model_dir(family), directory)
        check_exported_weights(directory)
        tensors = load_file(directory / "model.safetensors")
        del tensors[dropped]
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ExportError, match=f"1 missing: {dropped}"):
            check_exported_weights(directory)


def test_non_checkpoints_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="neither a DeepSpeed ZeRO checkpoint.*nor a torch.distributed"):
        consolidate_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no such file"):
        consolidate_checkpoint(tmp_path / "missing.ckpt")
    torch.save({"weights": torch.ones(1)}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="not a Lightning checkpoint"):
        consolidate_checkpoint(tmp_path / "plain.pt")
    # hyperparameters holding objects (a module built in Python): refused unless the file is trusted
    objects = {"state_dict": {"w": torch.ones(1)}, "hyper_parameters": {"schedule": SkipDecode()}}
    torch.save(objects, tmp_path / "o.ckpt")
    with pytest.raises(CheckpointError, match="weights_only=False"):
        consolidate_checkpoint(tmp_path / "o.ckpt")
    assert torch.equal(consolidate_checkpoint(tmp_path / "o.ckpt", weights_only=False)["w"], torch.ones(1))
