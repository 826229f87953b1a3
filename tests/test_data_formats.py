"""The data users have: messages, ShareGPT, Alpaca, prompt/completion and text files, detected and trained through the
CLI; multi-turn chats as one example per assistant turn, exact to KV-cached decoding after a full-depth prefill;
bad rows counted or refused by row and field; packing refused."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from helpers.chat_models import with_chat_template
from helpers.cli_args import tiny_args
from helpers.cli_runs import error_lines, run_cli
from helpers.tiny_models import tiny_model
from transformers import AutoModelForCausalLM, DynamicCache

from skiptrain import Dense, SkipDecode, skip_forward
from skiptrain.cli.app import main
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.errors import DataError, UsageError
from skiptrain.export.format import read_record
from skiptrain.modeling.architectures import decoder_parts
from skiptrain.modeling.forward import skip_hidden_states
from skiptrain.modeling.loading import load_tokenizer
from skiptrain.shipped.prompt_format import PromptFormat, PromptFormatError
from skiptrain.text.batch import IGNORE_INDEX, collate

ROOT = Path(__file__).resolve().parents[1]
DATA_PAGE = ROOT / "docs" / "data.md"
EXPECTED_TASKS = {"messages.jsonl": "messages", "sharegpt.jsonl": "sharegpt", "alpaca.jsonl": "alpaca",
                  "prompt_completion.jsonl": "prompt_completion", "prompt_completion_chat.jsonl": "prompt_completion",
                  "text.txt": "text"}
STEP = ("--trainer.max_steps", "1", "--trainer.limit_val_batches", "1", "--model.generation.num_batches", "0")


def page_commands() -> list[list[str]]:
    """The ``python -m skiptrain fit`` commands of docs/data.md, as argument lists."""
    block = re.search(r"<!-- run by tests/test_data_formats.py::\w+ -->\n```bash\n(.*?)\n```", DATA_PAGE.read_text(),
                      re.S)
    return [shlex.split(line)[3:] for line in block[1].splitlines()]


def data_file(command: list[str]) -> str:
    return Path(re.search(r"docs/data/(\S+)}", " ".join(command))[1]).name


@pytest.fixture(scope="module")
def chat_model(tiny_model_dir, tmp_path_factory) -> str:
    return with_chat_template(tiny_model_dir("llama"), tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def chat_tokenizer(chat_model):
    return load_tokenizer(chat_model)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_the_data_page_has_one_command_per_example_file():
    assert sorted(data_file(c) for c in page_commands()) == sorted(p.name for p in (ROOT / "docs/data").iterdir())


@pytest.mark.parametrize("command", page_commands(), ids=data_file)
def test_each_format_of_the_data_page_trains_through_the_cli(command, chat_model, tmp_path, monkeypatch,
                                                              lightning_log):
    monkeypatch.chdir(ROOT)
    cli = main([*command, *tiny_args(chat_model, tmp_path / "run", *STEP)])
    expected = EXPECTED_TASKS[data_file(command)]
    assert cli.datamodule.task == expected and cli.trainer.global_step == 1
    logged = [r.getMessage() for r in lightning_log.records]
    assert any(f"{expected} format, " in line for line in logged), logged
    assert any("are held out for validation" in line for line in logged), logged
    assert len(cli.datamodule.datasets["val"]) >= 1


# -- multi-turn, exact to inference ---------------------------------------------------------------------------------
CHAT = [{"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "When should I water tomatoes?"},
        {"role": "assistant", "content": "Early in the morning."},
        {"role": "user", "content": "How often?"},
        {"role": "assistant", "content": "Twice a week, more when it is hot."}]


def test_a_conversation_trains_one_example_per_assistant_turn_prompted_by_its_history(chat_tokenizer, tmp_path):
    dm = SkipDataModule(task="messages", data_files={"train": write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}])},
                        val_share=0, max_target_tokens=64)
    dm.set_tokenizer(chat_tokenizer)
    dm.setup("fit")
    examples = dm.datasets["train"]
    assert len(examples) == 2
    for turn, example in zip((2, 4), examples, strict=True):
        history = chat_tokenizer.apply_chat_template(CHAT[:turn], tokenize=False, add_generation_prompt=True)
        assert example["prompt_ids"] == chat_tokenizer(history, add_special_tokens=False)["input_ids"]
        assert chat_tokenizer.decode(example["target_ids"]) == CHAT[turn]["content"] + chat_tokenizer.eos_token
    batch = collate(list(examples), chat_tokenizer.pad_token_id)
    labelled = batch["labels"] != IGNORE_INDEX
    assert [chat_tokenizer.decode(row[mask]) for row, mask in zip(batch["input_ids"], labelled, strict=True)] == [
        CHAT[t]["content"] + chat_tokenizer.eos_token for t in (2, 4)]  # assistant tokens only


def test_turn_two_trains_as_kv_cached_decoding_after_a_full_depth_prefill_of_the_history(chat_tokenizer, tmp_path):
    num_layers = 6
    model = tiny_model("llama", num_layers, vocab_size=len(chat_tokenizer)).eval()
    schedule = SkipDecode(min_layers=2, max_layers=5, warmup_layers=1, decay_tokens=6).build(num_layers)
    assert schedule.prompt_layers == tuple(range(num_layers))  # the prompt, history included, runs every layer
    dm = SkipDataModule(task="messages", data_files={"train": write_jsonl(tmp_path / "c.jsonl", [{"messages": CHAT}])},
                        val_share=0, max_target_tokens=64)
    dm.set_tokenizer(chat_tokenizer)
    dm.setup("fit")
    turn_1, turn_2 = dm.datasets["train"]
    batch = collate([turn_1, turn_2], chat_tokenizer.pad_token_id)  # turn 2 trains beside a shorter prompt
    prompt_length = batch["prompt_length"]
    with torch.no_grad():
        trained = skip_forward(model, batch["input_ids"], batch["attention_mask"], schedule, prompt_length)[1]

    # serving turn 2: the history (turn 1's reply included) prefilled in one call, then the reply token by token
    parts = decoder_parts(model)
    prompt = torch.tensor([turn_2["prompt_ids"]])
    assert prompt.shape[1] == prompt_length  # the longest prompt: no padding in its row
    mask = torch.ones_like(prompt)
    cache = DynamicCache(config=model.config)
    decoded, new = [], prompt
    with torch.no_grad():
        for token in [None, *turn_2["target_ids"][:-1]]:
            if token is not None:
                new = torch.tensor([[token]])
                mask = torch.cat([mask, torch.ones_like(new)], dim=1)
            hidden = skip_hidden_states(model, new, mask, schedule, prompt_length, cache, parts)
            decoded.append(parts.logits(hidden[:, -1])[0])
    steps = len(turn_2["target_ids"])
    assert steps > 4
    decoded_logits = torch.stack(decoded)  # [steps, vocab]: the logits that chose each target token
    assert (trained[prompt_length - 1: prompt_length - 1 + steps] - decoded_logits).abs().max().item() <= 1e-4
    # the schedule really skips on turn 2's tokens: dense logits differ
    with torch.no_grad():
        dense = skip_forward(model, batch["input_ids"], batch["attention_mask"], Dense().build(num_layers),
                             prompt_length)[1]
    assert (dense[prompt_length + 1: prompt_length + steps] - trained[prompt_length + 1: prompt_length + steps]
            ).abs().max().item() > 1e-2


def test_a_messages_export_answers_a_chat_prompt_with_the_training_prompt_ids(chat_model, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    export = tmp_path / "export"
    callback = '{"class_path": "skiptrain.callbacks.export.ExportCallback", "init_args": {"output_dir": "%s"}}'
    cli = main(["fit", "--data.data_files", "{train: docs/data/messages.jsonl}",
                *tiny_args(chat_model, tmp_path / "run", *STEP, f"--trainer.callbacks+={callback % export}")])
    recorded = read_record(export).prompt_format
    assert recorded.chat_template and recorded.template == "{source}"
    tokenizer = load_tokenizer(str(export))
    chat = [{"role": "user", "content": "Say hello in French."}, {"role": "assistant", "content": "Bonjour."},
            {"role": "user", "content": "And goodbye?"}]
    _, (ids,) = recorded.encode(tokenizer, [{"messages": chat}])
    train = cli.datamodule.datasets["train"]["prompt_ids"]
    val = cli.datamodule.datasets["val"]["prompt_ids"]
    assert ids in [*train, *val]  # the prompt training made from the same history
    hf = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True).eval()
    out = hf.generate(sources=[{"messages": chat}], tokenizer=tokenizer, max_new_tokens=3, do_sample=False)
    assert out[0, :len(ids)].tolist() == ids

    # `skiptrain generate` answers the same chat given as a prompt line, under the schedule, as transformers does
    prompts = write_jsonl(tmp_path / "chat.jsonl", [{"messages": chat}])
    report = main(["generate", "--model.model", str(export), "--prompts", prompts, "--max_new_tokens", "3",
                   "--output", str(tmp_path / "answers.jsonl"), "--trainer.accelerator", "cpu"])
    (answer,) = report.completions
    assert answer.token_ids == out[0, len(ids):].tolist()
    assert json.loads((tmp_path / "answers.jsonl").read_text())["completion"] == answer.completion


# -- the prompt format of a chat ------------------------------------------------------------------------------------
def test_a_chat_source_renders_through_the_chat_template_with_the_generation_prompt(chat_tokenizer):
    chat_format = PromptFormat(chat_template=True)
    texts, ids = chat_format.encode(chat_tokenizer, [{"messages": CHAT[:4]}, json.dumps({"messages": CHAT[1:2]}),
                                                     CHAT[1]["content"]])
    assert texts[0] == chat_tokenizer.apply_chat_template(CHAT[:4], tokenize=False, add_generation_prompt=True)
    assert texts[1] == texts[2]  # one user turn renders as the bare source does
    with pytest.raises(PromptFormatError, match="last turn is the user's"):
        chat_format.encode(chat_tokenizer, [{"messages": CHAT}])
    with pytest.raises(PromptFormatError, match=r"messages\[0\].*allowed \{'role': one of"):
        chat_format.encode(chat_tokenizer, [{"messages": [{"role": "tool", "content": "x"}]}])
    with pytest.raises(PromptFormatError, match="needs chat_template=true"):
        PromptFormat().encode(chat_tokenizer, [{"messages": CHAT[:2]}])


def test_a_long_chat_loses_its_oldest_turns_but_the_system_turn(chat_tokenizer):
    limit = len(PromptFormat(chat_template=True).encode(chat_tokenizer, [{"messages": [CHAT[0], *CHAT[3:4]]}])[1][0])
    text, ids = PromptFormat(chat_template=True, max_source_tokens=limit).encode(
        chat_tokenizer, [{"messages": CHAT[:4]}])
    assert text[0] == chat_tokenizer.apply_chat_template([CHAT[0], CHAT[3]], tokenize=False, add_generation_prompt=True)
    assert len(ids[0]) <= limit


# -- bad rows and refusals -------------------------------------------------------------------------------------------
def test_bad_rows_are_skipped_and_counted_by_kind_row_and_field(chat_tokenizer, tmp_path):
    good = {"messages": CHAT[1:3]}
    rows = [good, {"messages": CHAT[:2]}, {"messages": [{"role": "robot", "content": "hi"}, CHAT[2]]}, good,
            {"messages": [CHAT[1], {"role": "assistant", "content": " "}]}, {"other": "x"},
            {"messages": [CHAT[0], CHAT[2]]}]
    dm = SkipDataModule(data_files={"train": write_jsonl(tmp_path / "bad.jsonl", rows)}, val_share=0)
    dm.set_tokenizer(chat_tokenizer)
    with pytest.warns(UserWarning) as warned:
        dm.setup("fit")
    assert len(dm.datasets["train"]) == 2
    (message,) = [str(w.message) for w in warned if "skipped" in str(w.message)]
    assert "skipped 5 of 7 rows: " in message
    for part in ("1 with no assistant turn (first: row 2, field 'messages')",
                 "1 with an unknown role (first: row 3, field 'messages[0].role')",
                 "1 with an empty target (first: row 5, field 'messages[1].content')",
                 "1 with a missing column (first: row 6, field 'messages')",
                 "1 with an assistant turn that does not follow a user turn (first: row 7, field 'messages[1]')"):
        assert part in message


def test_a_split_without_a_usable_row_is_refused_in_one_line_naming_file_row_and_field(chat_model, tmp_path, capsys):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"messages": CHAT[:2]}, {"messages": CHAT[:2]}])
    code, stderr = run_cli(["fit", "--data.data_files", f"{{train: {path}}}", *tiny_args(chat_model, tmp_path / "r")],
                           capsys)
    assert code == 1, stderr
    assert error_lines(stderr) == [f"skiptrain fit: error: {path} split 'train', row 1, field 'messages': no "
                                   "assistant turn; no row of the split gives an example of the messages format"]


@pytest.mark.parametrize(("options", "words"), [
    (("--data.packing", "true"), "packing=true is refused: the skip-aware forward runs each layer on one prefix"),
    (("--data.chat_template", "false"), "holds messages chats, rendered whole by the tokenizer's chat template"),
    (("--data.task", "auto", "--data.data_files", "{train: docs/data/../../pyproject.toml}"), "unsupported extension"),
], ids=["packing", "chat_template_false", "unreadable"])
def test_options_a_format_cannot_take_are_refused_in_one_line(options, words, chat_model, tmp_path, capsys,
                                                               monkeypatch):
    monkeypatch.chdir(ROOT)
    code, stderr = run_cli(["fit", "--data.data_files", "{train: docs/data/messages.jsonl}", *options,
                            *tiny_args(chat_model, tmp_path / "r")], capsys)
    assert code in (1, 2) and len(error_lines(stderr)) == 1 and words in error_lines(stderr)[0], stderr


def test_chat_data_with_a_tokenizer_without_a_chat_template_names_the_fix(tiny_model_dir, tmp_path, capsys,
                                                                            monkeypatch):
    monkeypatch.chdir(ROOT)
    code, stderr = run_cli(["fit", "--data.data_files", "{train: docs/data/sharegpt.jsonl}",
                            *tiny_args(tiny_model_dir("llama"), tmp_path / "r")], capsys)
    (line,) = error_lines(stderr)
    assert code == 2 and "needs a tokenizer with a chat template" in line and "use a chat (instruct) model" in line


def test_auto_names_the_formats_it_knows_when_none_matches(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(DataError, match=r"found no known format in the columns \['question', 'answer'\]; allowed: "
                                        r"messages: \['messages'\]; sharegpt"):
        SkipDataModule(data_files={"train": path})
    with pytest.raises(DataError, match="dataset 'nobody/nothing-here': cannot read the first row of split 'train' to "
                                        "find its format"):
        SkipDataModule(dataset_id="nobody/nothing-here")  # offline in the tests
    for task in ("auto", "messages"):
        with pytest.raises(UsageError, match=f"task='{task}' reads your data: give data.data_files or data.dataset_id"):
            SkipDataModule(task=task)


def test_without_a_validation_split_a_seeded_share_of_whole_conversations_is_held_out(chat_tokenizer, tmp_path,
                                                                                       lightning_log):
    rows = [{"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"A{i}."},
                          {"role": "user", "content": f"More {i}?"}, {"role": "assistant", "content": f"B{i}."}]}
            for i in range(20)]
    path = write_jsonl(tmp_path / "chats.jsonl", rows)

    def conversations(seed: int) -> tuple[set[str], set[str]]:
        dm = SkipDataModule(data_files={"train": path}, val_share=0.2, seed=seed)
        dm.set_tokenizer(chat_tokenizer)
        dm.setup("fit")
        assert (len(dm.datasets["train"]), len(dm.datasets["val"])) == (32, 8)  # 16 and 4 conversations
        return tuple({re.search(r"Question (\d+)", chat_tokenizer.decode(ids))[1]
                      for ids in dm.datasets[role]["prompt_ids"]} for role in ("train", "val"))

    train, val = conversations(seed=0)
    assert len(val) == 4 and not train & val  # no conversation is split between training and validation
    assert conversations(seed=0) == (train, val) and conversations(seed=1) != (train, val)
    assert any("so 4 of its 20 rows (8 examples) are held out for validation (data.val_share=0.2, seed 0)"
               in r.getMessage() for r in lightning_log.records)
    with pytest.raises(UsageError, match="val_share=1 is invalid: allowed 0 <= val_share < 1"):
        SkipDataModule(data_files={"train": path}, val_share=1)
