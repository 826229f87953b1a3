"""Inference without the data pipeline: raw prompts are batched as training batches hold prompts, and decode
cost has one definition (ideal speedup over the tokens actually generated)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.tiny_models import tiny_model
from helpers.tiny_tokenizer import build_tiny_tokenizer

from skiptrain.core.schedules import Dense, ScheduleError, SkipDecode, SkipSchedule
from skiptrain.core.speedup import batch_ideal_speedup, cost_summary, mean_executed_layers, parameter_read_speedup
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.frontends.inference import complete, generate_report, parameter_counts, prompt_batches
from skiptrain.modeling.loading import prepare_tokenizer
from skiptrain.text.batch import collate
from skiptrain.text.encoding import encode_pairs
from skiptrain.text.tasks import SOURCE_PLACEHOLDER, fill_template

PROMPTS = ["Write the weather forecast.\nData: city[Oslo]\nForecast:", "Monday", "The council met on Monday to"]


def test_inference_imports_no_data_pipeline():
    pipeline = ("datasets", "skiptrain.data.datamodule", "skiptrain.data.loading", "skiptrain.data.columns",
                "skiptrain.data.tokenized", "skiptrain.data.builtin_task")
    code = ("import json, sys, skiptrain.frontends.inference; "
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
    completions, stats = complete(model, tokenizer, schedule, PROMPTS, max_new_tokens=5, batch_size=2)
    assert [c.prompt for c in completions] == PROMPTS
    assert stats.lengths == tuple(c.num_tokens for c in completions) and stats.num_tokens == sum(stats.lengths)
    assert stats.mean_layers_per_token == mean_executed_layers(schedule, stats.lengths)
    assert stats.ideal_speedup == batch_ideal_speedup(schedule, stats.lengths)
    report = generate_report(model, tokenizer, schedule, PROMPTS, max_new_tokens=5, batch_size=2, compare_dense=True)
    assert f"(over {report.stats.num_tokens} generated tokens)" in report.summary()


def test_the_dense_comparison_times_equal_work_against_the_parameter_read_limit():
    tokenizer = prepare_tokenizer(build_tiny_tokenizer())
    model = tiny_model("llama", num_layers=4, vocab_size=len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    schedule = SkipDecode(min_layers=2, decay_tokens=4).build(4)
    report = generate_report(model, tokenizer, schedule, PROMPTS, max_new_tokens=7, batch_size=2, compare_dense=True)
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
