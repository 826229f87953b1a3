"""skiptrain calibrate: losses equal validation's exactly, the choice per target, the layer importance profile, the
fragments it writes train, and its refusals (the pure candidate search and Pareto front: tests/test_candidates.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cli_args import tiny_args

from skiptrain.cli.app import main
from skiptrain.core.schedules import Dense, SkipDecode
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.training.calibrate import importance_ranking, layer_importance, schedule_loss, target_lengths
from skiptrain.training.losses import target_cross_entropy
from skiptrain.training.module import SkipLM

TARGETS = [1.25, 1.5]


@pytest.fixture(scope="module")
def calibrated(tiny_model_dir, tmp_path_factory):
    """``skiptrain calibrate`` on a tiny 6-layer llama over the built-in task's validation split."""
    root = tmp_path_factory.mktemp("calibrate")
    model_dir = tiny_model_dir("llama", 6)
    common = tiny_args(model_dir, root / "run", "--data.task", "builtin", "--model.generation.num_batches", "0")
    cli = main(["calibrate", *common, "--output_dir", str(root / "out"), "--targets", json.dumps(TARGETS),
                "--per_target", "2", "--generation_batches", "1"])
    return cli, common, root / "out"


def candidates_table(out: Path) -> list[dict]:
    return json.loads((out / "candidates.json").read_text())


def test_calibrate_writes_table_plots_and_fragments(calibrated):
    cli, _, out = calibrated
    names = {p.name for p in out.iterdir()}
    assert {"candidates.json", "candidates.csv", "candidates.md", "importance.json", "importance.png", "pareto.png",
            "summary.json", "schedule_1.25x.yaml", "schedule_1.5x.yaml"} <= names
    table = candidates_table(out)
    assert {row["family"] for row in table} == {"dense", "skipdecode", "ranked", "hierarchical", "static"}
    assert len((out / "candidates.csv").read_text().splitlines()) == len(table) + 1
    assert all("bleu" in row for row in table if row["pareto"]), "the front is decoded and scored"
    importance = json.loads((out / "importance.json").read_text())
    assert sorted(importance["ranking"]) == list(range(6)) and importance["ranking"][0] == 0
    ranked = [row for row in table if row["family"] == "ranked"]
    assert ranked and all(row["params"]["ranking"] == importance["ranking"] for row in ranked)


def test_chosen_schedule_meets_each_target_with_the_lowest_loss(calibrated):
    _, _, out = calibrated
    table, summary = candidates_table(out), json.loads((out / "summary.json").read_text())
    for target in TARGETS:
        chosen = summary["targets"][f"{target:g}x"]["best"]
        assert chosen["ideal_speedup"] >= target
        assert chosen["loss"] == min(r["loss"] for r in table if r["ideal_speedup"] >= target)
        header = (out / f"schedule_{target:g}x.yaml").read_text().splitlines()[:3]
        assert f"ideal decode speedup {chosen['ideal_speedup']:.2f}x" in header[2]
        assert f"validation loss {chosen['loss']:.4f}" in header[1]


@pytest.mark.parametrize("target", TARGETS)
def test_fragment_validates_to_the_calibrated_loss_and_trains(calibrated, target, tmp_path):
    """The fragment parses with the CLI; validation under it gives calibrate's loss exactly; it trains a step."""
    _, common, out = calibrated
    fragment = out / f"schedule_{target:g}x.yaml"
    chosen = json.loads((out / "summary.json").read_text())["targets"][f"{target:g}x"]["best"]
    validated = main(["validate", *common, "--config", str(fragment)])
    assert validated.model.schedule_family.name == chosen["family"]
    assert float(validated.trainer.callback_metrics["val/loss_skip"]) == chosen["loss"]
    fit = main(["fit", *tiny_args(validated.model.model_name, tmp_path, "--data.task", "builtin",
                                  "--data.max_train_samples", "4", "--model.generation.num_batches", "0"),
                "--config", str(fragment), "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"])
    assert fit.trainer.global_step == 1
    assert torch.isfinite(fit.trainer.callback_metrics["train/loss"])


def test_refuses_a_non_empty_output_dir_and_bad_options(calibrated, tmp_path, capsys):
    _, common, out = calibrated
    before = (out / "candidates.json").read_text()
    cases = [(["--output_dir", str(out)], 2, "output_dir=", "exists and is not empty"),
             (["--output_dir", str(tmp_path / "x"), "--families", "[skipdecod]"], 2, "families=",
              "is invalid",
              "allowed"),
             (["--output_dir", str(tmp_path / "x"), "--grid", str(tmp_path / "no.yaml")], 1, "grid=", "cannot be read")]
    for args, code, *needles in cases:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            main(["calibrate", *common, *args])
        assert exited.value.code == code
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith("skiptrain calibrate: error: ") and all(n in line for n in needles), line
    assert (out / "candidates.json").read_text() == before
    assert not (tmp_path / "x").exists()


# -- losses and the importance profile -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_batches(tiny_model_dir):
    model_dir = tiny_model_dir("llama", 6)
    data = SkipDataModule(task="builtin", tokenizer=model_dir, max_eval_samples=8, eval_batch_size=4,
                          max_source_tokens=48, max_target_tokens=24)
    data.setup("validate")
    return model_dir, list(data.val_dataloader())


def module_for(model_dir: str, batches: list | None = None, steps: int = 0) -> SkipLM:
    """The tiny model in a SkipLM, densely fitted to ``batches`` for ``steps`` steps (so that its layers matter)."""
    module = SkipLM(model_dir, schedule=Dense())
    module.configure_model()
    optimizer = torch.optim.Adam(module.model.parameters(), lr=1e-2)
    for step in range(steps):
        loss = target_cross_entropy(*module.target_logits(batches[step % len(batches)], Dense().build(6)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    module.model.eval()
    return module


@pytest.mark.parametrize("layer", [2, 4])
def test_importance_ranks_an_identity_layer_least_important(tiny_batches, layer):
    model_dir, batches = tiny_batches
    torch.manual_seed(0)
    module = module_for(model_dir, batches, steps=40)
    with torch.no_grad():
        block = module.model.model.layers[layer]
        block.self_attn.o_proj.weight.zero_()
        block.mlp.down_proj.weight.zero_()  # the residual block now returns its input
    profile = layer_importance(module, batches, progress=False)
    assert profile[layer].loss_increase == 0.0
    assert profile[layer].cosine == pytest.approx(1.0, abs=1e-5)
    assert importance_ranking(profile)[-1] == layer
    assert all(p.loss_increase > 0.0 for p in profile if p.layer not in (0, layer)), "the fitted layers matter"


def test_schedule_loss_counts_every_target_token_once(tiny_batches):
    model_dir, batches = tiny_batches
    module = module_for(model_dir)
    lengths = target_lengths(batches)
    assert len(lengths) == 8 and all(n > 0 for n in lengths)
    dense = schedule_loss(module, batches, Dense().build(6))
    skipped = schedule_loss(module, batches, SkipDecode(min_layers=2, decay_tokens=4).build(6))
    one_batch = schedule_loss(module, batches[:1], Dense().build(6))
    assert dense != skipped and dense != one_batch
    total = sum(float(module.target_logits(b, Dense().build(6))[1].numel()) for b in batches)
    assert total == sum(lengths)
