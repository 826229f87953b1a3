"""Inference without the data pipeline or Lightning: raw prompts are batched as training batches hold prompts, decode
cost has one definition (ideal speedup over the tokens actually generated), and ``skiptrain generate`` takes one
checked request: a prompts file (chats too) or one streamed ``--prompt`` with stop strings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from helpers.tiny_models import tiny_model
from helpers.tiny_tokenizer import build_tiny_tokenizer

from skiptrain import load_exported
from skiptrain.cli.app import main
from skiptrain.core.schedules import Dense, ScheduleError, SkipDecode, SkipSchedule
from skiptrain.core.speedup import batch_ideal_speedup, cost_summary, mean_executed_layers, parameter_read_speedup
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.errors import PromptError, UsageError
from skiptrain.frontends.decode import Decoder, complete
from skiptrain.frontends.inference import generate_report
from skiptrain.frontends.prompts import prompt_batches, read_prompts
from skiptrain.frontends.request import GenerationRequest
from skiptrain.frontends.speed import parameter_counts
from skiptrain.modeling.loading import prepare_tokenizer
from skiptrain.text.batch import collate
from skiptrain.text.encoding import encode_pairs
from skiptrain.text.tasks import SOURCE_PLACEHOLDER, fill_template

PROMPTS = ["Write the weather forecast.\nData: city[Oslo]\nForecast:", "Monday", "The council met on Monday to"]


def test_inference_imports_no_data_pipeline():
    pipeline = ("datasets", "skiptrain.data.datamodule", "skiptrain.data.loading", "skiptrain.data.columns",
                "skiptrain.data.tokenized", "skiptrain.data.builtin_task")
    code = ("import json, sys, skiptrain.frontends.inference, skiptrain.cli.generate; "
            f"print(json.dumps([m for m in {pipeline!r} if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize("add_bos", [False, True])
def test_prompt_batches_equal_the_prompts_of_training_batches(add_bos):
    tokenizer = prepare_tokenizer(build_tiny_tokenizer(add_bos=add_bos))
    prompt_ids, target_ids = encode_pairs(tokenizer, SOURCE_PLACEHOLDER, PROMPTS, ["a", "b c", "d"], 10**6, 8)
    training = collate([{"prompt_ids": p, "target_ids": t} for p, t in zip(prompt_ids, target_ids, strict=True)],
                       tokenizer.pad_token_id)
    (inference,) = prompt_batches(tokenizer, PROMPTS, batch_size=len(PROMPTS))
    assert inference["prompt_length"] == training["prompt_length"]  # every prompt ends at the same column P
    assert inference["prompt_input_ids"].tolist() == training["prompt_input_ids"].tolist()
    assert inference["prompt_attention_mask"].tolist() == training["prompt_attention_mask"].tolist()
    mask = inference["prompt_attention_mask"]
    assert mask[:, -1].all() and mask[:, 0].tolist() == [1, 0, 0], "left padded: only the longest starts at 0"


def test_prompt_batches_equal_a_data_module_evaluation_batch():
    tokenizer = build_tiny_tokenizer()
    data = SkipDataModule(task="builtin", max_eval_samples=3, eval_batch_size=3)
    data.set_tokenizer(tokenizer)
    evaluation = next(iter(data.test_dataloader()))
    prompts = [fill_template(data.prompt_template, source) for source in evaluation["sources"]]
    (inference,) = prompt_batches(data.tokenizer, prompts, batch_size=3)
    assert inference["prompt_input_ids"].tolist() == evaluation["prompt_input_ids"].tolist()
    assert inference["prompt_attention_mask"].tolist() == evaluation["prompt_attention_mask"].tolist()


def test_prompt_batches_refuse_an_empty_batch_size():
    with pytest.raises(ValueError, match="batch_size=0 is invalid: allowed >= 1"):
        list(prompt_batches(build_tiny_tokenizer(), PROMPTS, batch_size=0))


def test_one_definition_of_mean_executed_layers_and_ideal_speedup():
    schedule = SkipDecode(min_layers=2, decay_tokens=6).build(6)
    for n in (1, 4, 6, 30):  # one row of n tokens: exactly the schedule's own numbers
        assert mean_executed_layers(schedule, [n]) == schedule.mean_layers_per_token(n)
        assert batch_ideal_speedup(schedule, [n]) == schedule.sequence_ideal_speedup(n)
    # rows of different lengths: every generated token counts once
    executed = sum(len(schedule.executed_layers(g)) for n in (3, 9) for g in range(n))
    assert mean_executed_layers(schedule, [3, 9]) == pytest.approx(executed / 12)
    assert batch_ideal_speedup(schedule, [3, 9]) == pytest.approx(6 / (executed / 12))
    assert cost_summary(schedule, [3, 9]).endswith(f"ideal decode speedup: {6 / (executed / 12):.2f}x "
                                                   "(over 12 generated tokens)")
    with pytest.raises(ScheduleError, match=r"lengths=\[0\] is invalid"):
        mean_executed_layers(schedule, [0])


def test_decode_stats_count_the_tokens_actually_generated():
    tokenizer = prepare_tokenizer(build_tiny_tokenizer())
    model = tiny_model("llama", num_layers=4, vocab_size=len(tokenizer))
    schedule = SkipDecode(min_layers=2, decay_tokens=4).build(4)
    completions, stats = complete(Decoder(model, tokenizer), schedule, PROMPTS, GenerationRequest(5, batch_size=2))
    assert [c.prompt for c in completions] == PROMPTS
    assert stats.lengths == tuple(c.num_tokens for c in completions) and stats.num_tokens == sum(stats.lengths)
    assert stats.mean_layers_per_token == mean_executed_layers(schedule, stats.lengths)
    assert stats.ideal_speedup == batch_ideal_speedup(schedule, stats.lengths)
    report = generate_report(Decoder(model, tokenizer), schedule, PROMPTS, GenerationRequest(5, 2, compare_dense=True))
    assert f"(over {report.stats.num_tokens} generated tokens)" in report.summary()


def test_the_dense_comparison_times_equal_work_against_the_parameter_read_limit():
    tokenizer = prepare_tokenizer(build_tiny_tokenizer())
    model = tiny_model("llama", num_layers=4, vocab_size=len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    schedule = SkipDecode(min_layers=2, decay_tokens=4).build(4)
    report = generate_report(Decoder(model, tokenizer), schedule, PROMPTS, GenerationRequest(7, 2, compare_dense=True))
    timed = report.comparison
    assert timed.skip.lengths == timed.dense.lengths == (7,) * len(PROMPTS)  # whatever the end-of-sequence tokens
    assert timed.dense.schedule == Dense().build(4) and timed.skip.schedule == schedule
    assert timed.measured_speedup == pytest.approx(timed.skip.tokens_per_s / timed.dense.tokens_per_s)
    layers, head = parameter_counts(model)
    assert len(layers) == 4 and head == len(tokenizer) * 32  # the LM head: vocab x hidden
    per_token = schedule.mean_layers_per_token(7)
    assert timed.parameter_read_limit == pytest.approx((4 * layers[0] + head) / (per_token * layers[0] + head))
    assert 1 < timed.parameter_read_limit < timed.skip.ideal_speedup == schedule.sequence_ideal_speedup(7)
    assert (f"measured speedup {timed.measured_speedup:.2f}x" in report.summary()
            and f"parameter-read limit {timed.parameter_read_limit:.2f}x (LM head included; decoder layers alone "
                f"{schedule.sequence_ideal_speedup(7):.2f}x)" in report.summary())


def test_the_parameter_read_limit_counts_every_layer_a_token_runs():
    schedule = SkipSchedule(num_layers=3, prompt_layers=(0, 1, 2), executed_layers_table=((0, 1, 2), (0, 2)))
    # tokens: g=0 reads 1 + 10 + 100 + head 1000, g=1 and g=2 read 1 + 100 + 1000
    assert parameter_read_speedup(schedule, [3], [1, 10, 100], 1000) == pytest.approx(
        1111 / ((1111 + 1101 + 1101) / 3))
    with pytest.raises(ScheduleError, match="layer_params has 2 entries: allowed one per decoder layer"):
        parameter_read_speedup(schedule, [3], [1, 10], 1000)


# -- without Lightning ----------------------------------------------------------------------------------------------
LIGHTNING = ("lightning", "pytorch_lightning", "lightning_utilities")


def loaded_lightning(code: str) -> list[str]:
    """The Lightning packages in ``sys.modules`` after ``code`` ran in a fresh interpreter."""
    packages = "sorted({m.split('.')[0] for m in sys.modules} & " + repr(set(LIGHTNING)) + ")"
    check = f"{code}\nimport json, sys\nprint(json.dumps({packages}))"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_load_exported_and_skiptrain_generate_load_no_lightning(skip_export, tmp_path):
    export = skip_export("llama")
    (tmp_path / "p.txt").write_text("The council met\n")
    assert loaded_lightning(f"from skiptrain import load_exported; load_exported({str(export)!r})") == []
    out = tmp_path / "out.jsonl"
    generate = ["generate", "--model.model", str(export), "--prompts", str(tmp_path / "p.txt"), "--output", str(out),
                "--max_new_tokens", "3", "--trainer.accelerator", "cpu", "--trainer.logger", "false"]
    assert loaded_lightning(f"from skiptrain.cli.app import main; main({generate!r})") == []
    assert json.loads(out.read_text())["num_tokens"] >= 1, "the command ran"
    assert "lightning" in loaded_lightning("import skiptrain.cli.lightning_cli"), "the check can fail"


# -- the one checked request -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "says"), [
    (dict(max_new_tokens=0), "max_new_tokens=0 is invalid: allowed >= 1"),
    (dict(batch_size=0), "batch_size=0 is invalid: allowed >= 1"),
    (dict(long_prompts="cut"), "long_prompts='cut' is invalid: allowed one of ['refuse', 'truncate']"),
    (dict(speculative=9, max_new_tokens=4), "speculative=9 is invalid with max_new_tokens=4"),
    (dict(speculative=2, dense=True), "dense=true is invalid with speculative=2"),
    (dict(draft_schedule="x.yaml"), "draft_schedule='x.yaml' is invalid without speculative"),
    (dict(speculative=2, stop=("\n",)), "stop=['\\n'] is invalid with speculative=2"),
    (dict(prompt="Hi", prompts="p.txt"), "prompt='Hi' is invalid with prompts='p.txt': allowed one of them"),
    (dict(prompt=" "), "prompt='' is invalid"),
    (dict(stop=("",)), "stop=[''] is invalid: allowed non-empty strings"),
])
def test_a_request_is_refused_in_one_line_naming_the_field(fields, says):
    with pytest.raises(UsageError) as refused:
        GenerationRequest(**fields)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_chat_prompt_line_passes_through_intact_and_a_malformed_one_is_refused_by_line(tmp_path):
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]}
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Monday"}) + "\n" + json.dumps(chat) + "\n")
    assert read_prompts(str(prompts)) == ["Monday", chat]
    for bad, says in ((dict(messages=[]), "non-empty list"),
                      (dict(messages=[{"role": "user"}]), "message 1 must be an object with a string 'content'"),
                      (dict(messages=[{"role": "robot", "content": "x"}]), "role='robot': allowed one of"),
                      (dict(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]),
                       "the last message has role='assistant': allowed 'user'")):
        prompts.write_text(json.dumps({"prompt": "Monday"}) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(PromptError, match=f"prompts='{prompts}' line 2: .*{says}"):
            read_prompts(str(prompts))


# -- the command line ------------------------------------------------------------------------------------------------
def test_one_prompt_is_streamed_and_ends_at_a_stop_string(skip_export, tmp_path, capsys):
    export = skip_export("llama")
    common = ["generate", "--model.model", str(export), "--prompt", PROMPTS[0], "--max_new_tokens", "8",
              "--raw_prompts", "true", "--trainer.accelerator", "cpu"]
    free = main([*common, "--output", str(tmp_path / "free.jsonl")])
    streamed = capsys.readouterr().out
    (line,) = (tmp_path / "free.jsonl").read_text().splitlines()
    assert json.loads(line)["completion"] == free.completions[0].completion
    assert free.completions[0].completion and streamed.rstrip().endswith(free.completions[0].completion)

    tokenizer = load_exported(export).tokenizer
    ids = free.completions[0].token_ids
    at = next(i for i in range(1, len(ids)) if tokenizer.decode(ids[i:i + 1]).strip())  # a visible later token
    stop = tokenizer.decode(ids[at:at + 1])
    assert free.completions[0].num_tokens == 8 > at + 1, "a free completion runs past the stop string"
    stopped = main([*common, "--stop", json.dumps([stop])]).completions[0]
    assert capsys.readouterr().out.strip() == stopped.completion, "stdout holds the streamed text only"
    assert stopped.token_ids == ids[:stopped.num_tokens] and stopped.num_tokens <= at + 1
    assert tokenizer.decode(stopped.token_ids).endswith(stop)


def test_the_help_says_skiptrain_and_generate_shows_its_own_options():
    done = subprocess.run([sys.executable, "-m", "skiptrain", "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: skiptrain ") and "Lightning Trainer command line tool" not in done.stdout
    assert "skip-aware fine-tuning" in done.stdout
    done = subprocess.run([sys.executable, "-m", "skiptrain", "generate", "--help"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    shown = done.stdout
    assert shown.startswith("usage: skiptrain generate ")
    for option in ("--model.model", "--prompts", "--prompt ", "--stop", "--max_new_tokens", "--sampling",
                   "--speculative", "--draft_schedule", "--raw_prompts", "--config", "--trainer.precision"):
        assert option in shown, option
    assert "--trainer.max_epochs" not in shown and len(shown.splitlines()) < 120


def test_a_run_config_gives_generate_its_options_and_nothing_else(skip_export, tmp_path):
    """A run's config.yaml configures training too: generate takes the keys it knows (here the budget from
    ``model.generation``) and leaves the others, while the command line still overrides it."""
    export = skip_export("llama")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "seed_everything": 0, "trainer": {"accelerator": "cpu", "max_epochs": 3, "logger": False},
        "model": {"model": str(export), "schedule": {"class_path": "skiptrain.SkipDecode"}, "lora": {"r": 4},
                  "generation": {"max_new_tokens": 3, "num_batches": 0}},
        "data": {"task": "builtin"}, "raw_prompts": True,
    }))
    (tmp_path / "p.txt").write_text("Monday\nThe council met\n")
    args = ["generate", "--config", str(config), "--prompts", str(tmp_path / "p.txt"), "--compare_dense", "true",
            "--output", str(tmp_path / "o.jsonl")]
    assert main(args).comparison.skip.lengths == (3, 3)  # equal work: end-of-sequence ignored
    assert main([*args, "--max_new_tokens", "2"]).comparison.skip.lengths == (2, 2)
