"""benchmarks/machine/scale_estimate.py: exact parameter counts, a cost model whose ratios move the right way, memory
sharded as the strategies shard it, and one line for a bad option."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from benchmarks.machine import recipe_headers
from benchmarks.machine import scale_estimate as se
from skiptrain.training.lora import with_adapters

LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": "all-linear"}


def tiny_recipe(tiny_model_dir, *fragments: str, family: str = "opt", layers: int = 24) -> se.Recipe:
    """recipes/opt1.3b_cnndm.yaml (24 layers) on a tiny model of the same layer count, plus ``fragments``."""
    model = json.dumps({"model": {"model": tiny_model_dir(family, layers)}})
    return se.read_recipe(["recipes/opt1.3b_cnndm.yaml", model, *fragments])


@pytest.mark.parametrize("family", ["opt", "llama"])
@pytest.mark.parametrize("lora", [None, LORA])
def test_parameters_are_counted_exactly(family, lora, tiny_model_dir):
    """The meta-device count equals the real model's, adapters included, and its trainable count peft's."""
    shape = se.model_shape(tiny_model_dir(family, 4), lora)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(family, 4))  # the real model, weights and all
    if lora is not None:
        model = with_adapters(model, lora)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if lora else shape.parameters
    assert shape.trainable == trainable
    assert sum(shape.layer_adapters) == (trainable if lora else 0)


def test_hub_configs_give_the_published_sizes():
    """The recipes' hub models, built from the table, have the parameter counts the hub's weights hold (1.3B, 6.7B
    and 1.24B, as their model cards round them)."""
    sizes = {name: se.model_shape(name, None).parameters for name in se.HUB_CONFIGS}
    assert sizes == {"facebook/opt-1.3b": 1_315_758_080, "facebook/opt-6.7b": 6_658_473_984,
                     "meta-llama/Llama-3.2-1B": 1_235_814_400}


def test_lora_costs_less_than_full_fine_tuning_and_joint_about_twice(tiny_model_dir):
    full = tiny_recipe(tiny_model_dir)
    lora = dataclasses.replace(full, lora=LORA)
    cost = {name: sum(se.step_flops(se.model_shape(r.model, r.lora), r).values())
            for name, r in {"full": full, "lora": lora, "joint": dataclasses.replace(lora, dense_loss_weight=1.0),
                            "dense": dataclasses.replace(lora, schedule=se.Dense().build(24))}.items()}
    assert cost["lora"] < cost["full"]
    # the joint objective adds a full-depth pass: more than twice the skipped pass, at most skipped + dense
    assert 2 * cost["lora"] < cost["joint"] == pytest.approx(cost["lora"] + cost["dense"])
    dense_joint = dataclasses.replace(lora, schedule=se.Dense().build(24), dense_loss_weight=1.0)
    assert sum(se.step_flops(se.model_shape(lora.model, lora.lora), dense_joint).values()) == pytest.approx(
        2 * cost["dense"])


def test_a_flat_schedule_saves_on_target_columns_only(tiny_model_dir):
    """Half the layers on target columns: the decoder's matmul FLOPs fall to (P + T / 2) / (P + T) of dense."""
    flat = json.dumps({"model": {"schedule": {"class_path": "skiptrain.SkipDecode", "init_args": {
        "max_layers": 12, "min_layers": 12, "warmup_layers": 1, "decay_tokens": 1}}}})
    recipe = tiny_recipe(tiny_model_dir, flat)
    shape = dataclasses.replace(se.model_shape(recipe.model, None), head=0, attention_width=0)  # matmuls alone
    dense = dataclasses.replace(recipe, schedule=se.Dense().build(24))
    p, t = recipe.prompt, recipe.target
    assert (sum(se.step_flops(shape, recipe).values()) / sum(se.step_flops(shape, dense).values())
            == pytest.approx((p + t / 2) / (p + t)))


def test_zero3_shards_weights_gradients_and_optimizer_zero2_not_weights(tiny_model_dir):
    recipe = tiny_recipe(tiny_model_dir, "recipes/strategies/deepspeed_zero3.yaml")
    assert recipe.strategy == ("deepspeed", 3, False)
    shape = se.model_shape(recipe.model, recipe.lora)
    one, eight = se.gpu_memory(shape, recipe, 1), se.gpu_memory(shape, recipe, 8)
    for part in ("weights", "gradients", "AdamW states"):
        assert eight[part] == pytest.approx(one[part] / 8)
    assert eight["activations"] == one["activations"] and "gathered layer" in eight
    two = se.gpu_memory(shape, dataclasses.replace(recipe, strategy=("deepspeed", 2, False)), 8)
    assert two["weights"] == one["weights"] and two["gradients"] == eight["gradients"]
    plain = se.gpu_memory(shape, dataclasses.replace(recipe, strategy=("single", 0, False)), 1)
    assert plain["weights"] == 4 * shape.parameters and plain["autocast copies"] == 2 * shape.parameters


def test_a_teacher_run_that_is_not_here_is_estimated_as_a_float32_copy(tiny_model_dir):
    run = json.dumps({"model": {"distillation": {"weight": 1.0, "teacher": "runs/elsewhere/dense/last.ckpt"}}})
    recipe = tiny_recipe(tiny_model_dir, "recipes/fragments/lora.yaml", run)
    assert recipe.teacher == "run" and recipe.kl
    shape = se.model_shape(recipe.model, recipe.lora)
    assert se.gpu_memory(shape, recipe, 1)["teacher (float32)"] == 4 * (shape.parameters - shape.trainable)
    assert "teacher" in se.step_flops(shape, recipe)


def test_the_estimate_reads_the_recipe(tiny_model_dir):
    text = se.estimate(tiny_recipe(tiny_model_dir), "a100-80", 2)
    assert "not run at this size" in text and "2 x NVIDIA A100 SXM 80GB" in text
    assert "287,113 examples / 64 per step" in text  # batch 8 x accumulate 4 x 2 GPUs


def test_study_rows_compose_as_study_sh_composes_them():
    assert se.row_configs("e2e", "flat2x+lora_all_r64+joint_s1") == [
        "benchmarks/quality/e2e/train_base.yaml", "benchmarks/quality/schedules/flat2x.yaml",
        "benchmarks/quality/levers/lora_all_r64.yaml", "benchmarks/quality/levers/joint.yaml"]
    pairs = {what: measured for what, *_, measured, _ in se.measured_pairs()}
    assert any(what.startswith("e2e: calibrated2x+lora_all_r64+joint / calibrated2x+lora_all_r64") for what in pairs)


@pytest.mark.parametrize(("args", "named"), [(["--gpu", "v100"], "--gpu 'v100' is invalid: allowed h100"),
                                             (["--gpus", "0"], "--gpus 0 is invalid")])
def test_a_bad_option_is_one_line(args, named, capsys):
    with pytest.raises(SystemExit) as exited:
        se.main(["recipes/opt1.3b_cnndm.yaml", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and err.startswith("scale_estimate: error:")


def test_every_large_recipe_header_quotes_its_expected_cost():
    """The OPT and Llama recipes' headers carry the cost model's numbers for the recipe as it now stands
    (python -m benchmarks.machine.recipe_headers --write rewrites them)."""
    assert [r.name for r in recipe_headers.large_recipes()] == [
        "llama3.2-1b_xsum.yaml", "opt1.3b_cnndm.yaml", "opt1.3b_e2e.yaml", "opt1.3b_reddit_tldr.yaml",
        "opt6.7b_cnndm.yaml", "opt6.7b_e2e.yaml", "opt6.7b_reddit_tldr.yaml"]
    assert recipe_headers.stale(recipe_headers.large_recipes()) == []


def test_a_recipe_changed_without_its_header_is_stale_and_rewritten_in_place(tmp_path):
    recipe = tmp_path / "opt6.7b_cnndm.yaml"
    recipe.write_text(Path("recipes/opt6.7b_cnndm.yaml").read_text().replace("max_epochs: 3", "max_epochs: 1"))
    assert recipe_headers.stale([recipe]) == [recipe]
    lines = recipe_headers.expected_lines(recipe)
    assert "as written: 2 x H100 with recipes/strategies/deepspeed_zero3.yaml" in lines[2]  # 1 x H100 cannot hold it
    epoch, run = re.search(r"GB a GPU, (.+) an epoch, (.+) in all$", lines[2]).groups()
    assert epoch == run  # max_epochs: 1
    recipe.write_text(recipe_headers.with_expected(recipe.read_text(), lines))
    assert recipe_headers.stale([recipe]) == [] and recipe.read_text().count(recipe_headers.MARK) == 1
