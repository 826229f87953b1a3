"""An export carries its prompt format: skiptrain's ``generate`` and conformance kit and plain transformers
``generate()`` through the custom generate (``sources=``) build from bare sources exactly the prompt ids training
built; chat templates and templates of several columns train the same way, and mistakes are refused by name."""

from __future__ import annotations

import csv
import json
import re

import pytest
import torch
from helpers.chat_models import with_chat_template
from helpers.cli_args import tiny_args
from transformers import AutoModelForCausalLM

from skiptrain import generate_under_schedule, load_exported
from skiptrain.cli.app import main
from skiptrain.cli.trainer import SkipTrainer
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.errors import DataError, UsageError
from skiptrain.export.format import read_record
from skiptrain.modeling.loading import load_tokenizer
from skiptrain.shipped.prompt_format import PromptFormat, PromptFormatError
from skiptrain.text.batch import collate_prompts
from skiptrain.training.module import SkipLM

EXPORT = '{"class_path": "skiptrain.callbacks.export.ExportCallback", "init_args": {"output_dir": "%s"}}'
NEW_TOKENS = 8


def fit_export(model_dir: str, root, *extra: str):
    """Fit two steps on the builtin task with the export callback; the CLI object and the export directory."""
    cli = main(["fit", *tiny_args(
        model_dir, root / "fit", "--data.task", "builtin", "--data.max_train_samples", "8",
        "--model.generation.num_batches", "0", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
        f"--trainer.callbacks+={EXPORT % (root / 'export')}", *extra,
    )])
    return cli, root / "export"


def training_prompts(cli) -> tuple[list[str], list[list[int]]]:
    """Bare sources of the validation split and the prompt ids training made from them."""
    rows = cli.datamodule.datasets["val"]
    return list(rows["source"])[:3], [list(ids) for ids in rows["prompt_ids"][:3]]


@pytest.fixture(scope="module")
def templated(tiny_model_dir, tmp_path_factory):
    return fit_export(tiny_model_dir("llama"), tmp_path_factory.mktemp("templated"))


@pytest.fixture(scope="module")
def chat_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny llama with a chat template on its tokenizer."""
    return with_chat_template(tiny_model_dir("llama"), tmp_path_factory.mktemp("chat_model") / "model")


def prompts_file(path, sources) -> str:
    path.write_text("".join(json.dumps({"prompt": s}) + "\n" for s in sources))
    return str(path)


def check_front_ends(export, sources, expected_ids, tmp_path):
    """skiptrain generate, the conformance kit and the custom generate all decode ``sources`` from the training ids."""
    trainer = SkipTrainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    prompts = prompts_file(tmp_path / "sources.jsonl", sources)
    vectors = tmp_path / "vectors.json"
    trainer.conformance(SkipLM(str(export)), vectors=str(vectors), prompts=prompts, max_new_tokens=NEW_TOKENS)
    assert [case["prompt_token_ids"] for case in json.loads(vectors.read_text())["cases"]] == expected_ids
    assert [case["prompt"] for case in json.loads(vectors.read_text())["cases"]] == sources

    model, schedule, tokenizer = load_exported(export)
    batch = collate_prompts(expected_ids, tokenizer.pad_token_id)
    reference = generate_under_schedule(model, batch["prompt_input_ids"], batch["prompt_attention_mask"], schedule,
                                        max_new_tokens=NEW_TOKENS, eos_token_id=tokenizer.eos_token_id,
                                        pad_token_id=tokenizer.pad_token_id)
    report = trainer.generate(SkipLM(str(export)), prompts=prompts, output=str(tmp_path / "out.jsonl"),
                              max_new_tokens=NEW_TOKENS)
    generated = [row[:n] for row, n in zip(reference.tokens.tolist(), reference.lengths.tolist(), strict=True)]
    assert [c.token_ids for c in report.completions] == generated

    hf = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True).eval()
    out = hf.generate(sources=sources, tokenizer=tokenizer, max_new_tokens=NEW_TOKENS, do_sample=False)
    width = batch["prompt_input_ids"].shape[1]
    assert torch.equal(out[:, :width], batch["prompt_input_ids"]), "the training prompt ids, left-padded"
    for row, (tokens, n) in enumerate(zip(reference.tokens.tolist(), reference.lengths.tolist(), strict=True)):
        assert out[row, width:width + n].tolist() == tokens[:n]


def test_an_export_decodes_bare_sources_with_its_training_prompts(templated, tmp_path):
    cli, export = templated
    sources, expected = training_prompts(cli)
    record = read_record(export)
    assert record.prompt_format == PromptFormat("Write the weather forecast.\nData: {source}\nForecast:",
                                                max_source_tokens=48)
    assert "the template" in (export / "README.md").read_text()
    check_front_ends(export, sources, expected, tmp_path)

    # --raw_prompts true tokenises the bare source as it is: other prompt ids, which decode to other tokens
    out = tmp_path / "raw.jsonl"
    main(["generate", "--model.model", str(export), "--prompts", prompts_file(tmp_path / "p.jsonl", sources),
          "--output", str(out), "--max_new_tokens", str(NEW_TOKENS), "--raw_prompts", "true",
          "--trainer.logger", "false"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == sources
    model, schedule, tokenizer = load_exported(export)
    raw_ids = PromptFormat().encode(tokenizer, sources)[1]
    assert raw_ids != expected

    def decoded(prompt_ids: list[list[int]]) -> list[list[int]]:
        batch = collate_prompts(prompt_ids, tokenizer.pad_token_id)
        out = generate_under_schedule(model, batch["prompt_input_ids"], batch["prompt_attention_mask"], schedule,
                                      NEW_TOKENS, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id)
        return [row[:n] for row, n in zip(out.tokens.tolist(), out.lengths.tolist(), strict=True)]

    assert [row["token_ids"] for row in rows] == decoded(raw_ids) != decoded(expected), "decoded from the raw ids"


def test_a_source_cut_to_the_recorded_length_is_named_in_one_warning(templated, tmp_path):
    export = templated[1]
    prompts = prompts_file(tmp_path / "p.jsonl", ["city[Oslo]", " ".join(["city[Oslo] weather[sunny]"] * 40)])
    with pytest.warns(UserWarning) as warned:
        main(["generate", "--model.model", str(export), "--prompts", prompts, "--output", str(tmp_path / "o.jsonl"),
              "--max_new_tokens", "2"])
    (line,) = [str(w.message) for w in warned if "max_source_tokens" in str(w.message)]
    found = re.fullmatch(r"skiptrain generate: sources cut to the recorded max_source_tokens=48, as in training: "
                         r"prompt 2 from (\d+) to (\d+) tokens", line)
    assert found and int(found[1]) > 48 >= int(found[2]), line


def test_a_chat_template_run_trains_exports_and_round_trips(chat_model_dir, tmp_path):
    cli, export = fit_export(chat_model_dir, tmp_path, "--data.chat_template", "true", "--data.system_message",
                             "Be brief.", "--data.max_source_tokens", "160")  # the chat turns take tokens too
    sources, expected = training_prompts(cli)
    tokenizer = load_tokenizer(chat_model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": f"Write the weather forecast.\nData: {sources[0]}\nForecast:"}],
        tokenize=False, add_generation_prompt=True)
    assert expected[0] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert text.endswith("<|im_start|>assistant\n")
    train = next(iter(cli.datamodule.train_dataloader()))
    assert bool((train["labels"][:, : train["prompt_length"]] == -100).all()), "targets alone are labelled"
    assert read_record(export).prompt_format.chat_template
    check_front_ends(export, sources, expected, tmp_path)


def test_a_template_of_several_columns(tiny_model_dir, tmp_path):
    data = tmp_path / "restaurants.csv"
    with data.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["name", "area", "ref"])
        writer.writerows([("The Eagle", "riverside", "The Eagle is by the river."),
                          ("Zizzi", "city centre", "Zizzi is in the city centre.")])
    template = "Name: {name}\nArea: {area}\nSentence:"

    def module(prompt_template: str) -> SkipDataModule:
        return SkipDataModule(task="e2e_nlg", tokenizer=tiny_model_dir("llama"), prompt_template=prompt_template,
                              data_files={"train": str(data)}, target_column="ref")

    dm = module(template)
    dm.setup("fit")
    tokenizer = dm.tokenizer
    prompt_ids = {tokenizer.decode(ids): ids for ids in dm.datasets["train"]["prompt_ids"]}
    eagle = prompt_ids["Name: The Eagle\nArea: riverside\nSentence:"]
    with pytest.raises(DataError, match=r"names column\(s\) \['food'\] that the data lacks"):
        module("Name: {name}\nFood: {food}\nSentence:").setup("fit")

    prompt_format = dm.prompt_format
    by_object = prompt_format.encode(tokenizer, [{"name": "The Eagle", "area": "riverside"}])[1]
    assert by_object == [eagle], "a prompt line's template object fills the same prompt"
    with pytest.raises(PromptFormatError, match=r"missing field\(s\) \['area'\]"):
        prompt_format.encode(tokenizer, [{"name": "The Eagle"}])
    with pytest.raises(PromptFormatError, match="allowed an object of their values, not a bare string"):
        prompt_format.encode(tokenizer, ["The Eagle"])


def test_prompt_format_refusals(tiny_model_dir, templated):
    with pytest.raises(UsageError, match="names no field"):
        SkipDataModule(task="builtin", prompt_template="no field here")
    with pytest.raises(UsageError, match=r"names \['source'\] more than once"):
        SkipDataModule(task="builtin", prompt_template="{source} and {source}")
    with pytest.raises(UsageError, match="system_message='x' needs chat_template=true"):
        SkipDataModule(task="builtin", system_message="x")
    dm = SkipDataModule(task="builtin", tokenizer=tiny_model_dir("llama"), chat_template=True)
    with pytest.raises(PromptFormatError, match="chat_template=true needs a tokenizer with a chat template"):
        dm.setup("fit")
    hf = AutoModelForCausalLM.from_pretrained(templated[1], trust_remote_code=True)
    with pytest.raises(ValueError, match="sources= needs tokenizer="):  # the export's own SkipScheduleError
        hf.generate(sources=["x"], max_new_tokens=1)
