"""QLoRA: tiny random Llama and OPT models with 4-bit NF4 base weights (bitsandbytes on the CPU, float32 compute)
train under a schedule, decode exactly as they train, export losslessly and refuse what they cannot do."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes", reason="QLoRA needs the optional extra skiptrain[qlora]")

from helpers.cli_args import read_metrics, tiny_args  # noqa: E402
from helpers.cli_runs import error_lines, run_cli, snapshot  # noqa: E402
from helpers.exports import EXPORT_CALLBACK, PROMPTS, Run, left_padded, minimal_decode  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from skiptrain import Dense, SkipSchedule, generate_under_schedule, load_exported, skip_forward  # noqa: E402
from skiptrain.cli.app import main  # noqa: E402
from skiptrain.export.format import SCHEDULE_FILE  # noqa: E402
from skiptrain.training.module import SkipLM  # noqa: E402
from skiptrain.training.sources import load_trained_model, resolve_weights_source  # noqa: E402

NUM_LAYERS = 4
# bitsandbytes' CPU kernels need layers at least one 64-wide quantization block wide
WIDTH = 64
QUANTIZATION = "{bits: 4, type: nf4, double_quant: true, compute_dtype: float32}"
LORA = "{r: 4, lora_alpha: 8, lora_dropout: 0}"


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    """``model_dir(family)``: a saved tiny random model, 64 wide, with the tiny tokenizer."""
    return lambda family: tiny_model_dir(family, NUM_LAYERS, width=WIDTH)


@pytest.fixture(scope="module")
def qlora_run(model_dir, tmp_path_factory):
    """``qlora_run(family)``: 3 QLoRA steps under SkipDecode with the export callback; cached."""
    runs = {}

    def run(family: str) -> Run:
        if family not in runs:
            root = tmp_path_factory.mktemp(f"qlora_{family}")
            path, export_dir = model_dir(family), root / "export"
            cli = main(["fit", *tiny_args(
                path, root / "fit", "--data.task", "builtin", "--data.max_train_samples", "12",
                "--model.lora", LORA, "--model.quantization", QUANTIZATION, "--model.optimizer.learning_rate", "0.02",
                "--model.generation.num_batches", "0", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1",
                "--trainer.log_every_n_steps", "1", "--seed_everything", "1",
                f"--trainer.callbacks+={EXPORT_CALLBACK % export_dir}",
            )])
            runs[family] = Run(cli, path, root / "fit", export_dir)
        return runs[family]

    return run


def fresh_module(run: Run) -> SkipLM:
    """The run's module as configured before training: the same quantized base, adapters not yet trained."""
    trained = run.cli.model
    module = SkipLM(model=run.model_dir, schedule=trained.schedule_family, lora=trained.lora,
                    quantization=trained.quantization)
    module.configure_model()
    return module


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_qlora_trains_only_the_adapters(family, qlora_run):
    run = qlora_run(family)
    trained = run.cli.model.model
    linear4bit = [m for m in trained.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert linear4bit and all(m.weight.dtype == torch.uint8 for m in linear4bit)
    assert run.cli.trainer.global_step == 3
    losses = [float(row["train/loss"]) for row in read_metrics(run.run_dir) if row.get("train/loss")]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))

    before = dict(fresh_module(run).model.state_dict())
    after = trained.state_dict()
    assert before.keys() == after.keys()
    changed = {k for k in after if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed), sorted(changed)
    assert any("lora_B" in k for k in changed), "the adapters did not train"
    assert all(not p.requires_grad for n, p in trained.named_parameters() if "lora_" not in n)


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_the_4bit_training_forward_equals_kv_cached_skip_decoding(family, qlora_run):
    module = qlora_run(family).cli.model
    model, schedule = module.model.eval(), module.schedule
    prompt_length, steps = 7, 10
    tokenizer = module.get_tokenizer()
    ids, mask = left_padded(tokenizer, [p[:25] for p in PROMPTS])
    prompt_length = ids.shape[1]
    decoded = generate_under_schedule(model, ids, mask, schedule, max_new_tokens=steps, return_logits=True)
    full_ids = torch.cat([ids, decoded.tokens], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(decoded.tokens)], dim=1)
    with torch.no_grad():
        logits = skip_forward(model, full_ids, full_mask, schedule, prompt_length)
        dense = skip_forward(model, full_ids, full_mask, Dense().build(NUM_LAYERS), prompt_length)
    trained_view = logits[:, prompt_length - 1 : prompt_length - 1 + steps]
    assert (trained_view - decoded.logits).abs().max().item() <= 1e-4
    assert (dense[:, prompt_length:] - logits[:, prompt_length:]).abs().max().item() > 1e-2, "nothing was skipped"


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_the_export_is_the_dequantized_base_plus_adapters_and_decodes_as_generate(family, qlora_run, tmp_path):
    run = qlora_run(family)
    module = run.cli.model
    tokenizer = module.get_tokenizer()
    ids, mask = left_padded(tokenizer, PROMPTS)
    prompt_length = ids.shape[1]

    # plain transformers loads the merged export; under the schedule it computes what the 4-bit model trained
    plain = AutoModelForCausalLM.from_pretrained(run.export_dir).eval()
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in plain.modules())
    with torch.no_grad():
        exported = skip_forward(plain, ids, mask, module.schedule, prompt_length)
        training = skip_forward(module.model.eval(), ids, mask, module.schedule, prompt_length)
    torch.testing.assert_close(exported, training, atol=1e-4, rtol=0)

    # the record and the card say how the weights were made
    record = json.loads((run.export_dir / SCHEDULE_FILE).read_text())
    assert record["base_quantization"] == {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": "float32"}
    assert "dequantized to float32 plus the adapter" in (run.export_dir / "README.md").read_text()

    # skiptrain generate on the export == greedy decoding of the plain model from skip_schedule.json alone (the
    # prompts as given, not filled into the recorded training template)
    prompts, output = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    main(["generate", "--model.model", str(run.export_dir), "--prompts", str(prompts), "--max_new_tokens", "8",
          "--raw_prompts", "true",
          "--batch_size", "3", "--trainer.accelerator", "cpu", "--trainer.logger", "false", "--output", str(output)])
    generated = [json.loads(line)["token_ids"] for line in output.read_text().splitlines()]
    schedule = SkipSchedule(record["num_layers"], tuple(record["prompt_layers"]),
                            tuple(tuple(s) for s in record["executed_layers"]))
    plain_tokenizer = AutoTokenizer.from_pretrained(run.export_dir, padding_side="left")
    assert generated == minimal_decode(plain, *left_padded(plain_tokenizer, PROMPTS), schedule, 8,
                                       plain_tokenizer.eos_token_id)


def test_an_adapter_export_and_the_checkpoint_give_back_the_trained_model(qlora_run, tmp_path):
    run = qlora_run("llama")
    (ckpt,) = [p for p in run.run_dir.rglob("*.ckpt") if p.name != "last.ckpt"] or list(run.run_dir.rglob("*.ckpt"))
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert not any("quant_state" in k or k.endswith(".absmax") for k in state), "the checkpoint holds 4-bit weights"
    assert any("lora_B" in k for k in state)
    adapter_dir = tmp_path / "adapter"
    main(["export", "--model.model", run.model_dir, "--ckpt_path", str(ckpt), "--output_dir", str(adapter_dir),
          "--adapter_only", "true"])
    assert json.loads((adapter_dir / SCHEDULE_FILE).read_text())["base_quantization"]["type"] == "nf4"
    ids, mask = left_padded(run.cli.model.get_tokenizer(), PROMPTS)
    reference = AutoModelForCausalLM.from_pretrained(run.export_dir).eval()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        for model in (load_exported(adapter_dir).model, load_trained_model(resolve_weights_source(ckpt)).eval()):
            torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, expected, atol=1e-5, rtol=0)


def test_calibrate_profiles_the_quantized_checkpoint(qlora_run, tmp_path):
    run = qlora_run("llama")
    ckpt = next(run.run_dir.rglob("*.ckpt"))
    out = tmp_path / "calibrated"
    cli = main(["calibrate", *tiny_args(run.model_dir, tmp_path / "run", "--data.task", "builtin",
                                        "--model.generation.num_batches", "0"),
                "--model.lora", LORA, "--model.quantization", QUANTIZATION, "--ckpt_path", str(ckpt),
                "--output_dir", str(out), "--targets", "[1.25]", "--per_target", "1", "--generation_batches", "1"])
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in cli.model.model.modules())
    candidates = json.loads((out / "candidates.json").read_text())
    assert candidates and all(torch.isfinite(torch.tensor(c["loss"])) for c in candidates)


# -- a refusal of its own: bitsandbytes missing (the others are cases of test_user_errors.py) ---------------------
def fit_argv(model: str, tmp: Path, *extra: str) -> list[str]:
    return ["fit", *tiny_args(model, tmp / "run", "--data.task", "builtin", "--data.max_train_samples", "4",
                              "--trainer.max_steps", "1", "--model.generation.num_batches", "0", *extra)]


def test_without_bitsandbytes_quantization_names_the_extra(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # what `import bitsandbytes` meets when not installed
    before = snapshot(tmp_path)
    code, stderr = run_cli(fit_argv(model_dir("llama"), tmp_path, "--model.lora", LORA, "--model.quantization",
                                    QUANTIZATION), capsys)
    lines = error_lines(stderr)
    assert code == 2 and len(lines) == 1, stderr
    assert "needs bitsandbytes, which is not installed: pip install 'skiptrain[qlora]'" in lines[0]
    assert snapshot(tmp_path) == before
