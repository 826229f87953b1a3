"""The SmolLM2-Instruct chat-template fragment trains and exports, and its prompts round-trip through generate.

Fits ``recipes/quickstart.yaml`` + ``recipes/fragments/smollm2-135m_chat.yaml`` for a few steps with the export
callback, then compares, for validation sources, the prompt ids training made with those that ``skiptrain
conformance`` / ``generate`` and plain transformers ``generate(sources=...)`` through the export's custom generate
make from the bare sources; also that the completions of the two front-ends agree. Writes a JSON result.

    python -m benchmarks.quality.chat_roundtrip --steps 8 --out benchmarks/results/smollm2_chat_roundtrip.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from benchmarks.common.machine import cpu_model
from skiptrain import generate_under_schedule, load_exported
from skiptrain.cli.app import main
from skiptrain.cli.trainer import SkipTrainer
from skiptrain.text.batch import collate_prompts
from skiptrain.training.module import SkipLM

ROOT = Path(__file__).resolve().parents[2]
EXPORT = '{"class_path": "skiptrain.callbacks.export.ExportCallback", "init_args": {"output_dir": "%s"}}'


def run(steps: int, sources_count: int, new_tokens: int, work: Path) -> dict:
    started = time.perf_counter()
    cli = main(["fit", "--config", str(ROOT / "recipes/quickstart.yaml"),
                "--config", str(ROOT / "recipes/fragments/smollm2-135m_chat.yaml"),
                "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps),
                "--data.max_train_samples", str(8 * steps),
                "--data.max_eval_samples", str(sources_count), "--model.generation.num_batches", "0",
                "--trainer.default_root_dir", str(work / "run"), "--trainer.logger.init_args.save_dir",
                str(work / "run"), "--trainer.callbacks+=" + EXPORT % (work / "export")])
    fit_seconds = time.perf_counter() - started
    val = cli.datamodule.datasets["val"]
    sources = list(val["source"])[:sources_count]
    trained_ids = [list(ids) for ids in val["prompt_ids"][:sources_count]]
    export = work / "export"

    prompts = work / "sources.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": s}) + "\n" for s in sources))
    trainer = SkipTrainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    vectors = work / "vectors.json"
    trainer.conformance(SkipLM(str(export)), vectors=str(vectors), prompts=str(prompts), max_new_tokens=new_tokens)
    kit_ids = [case["prompt_token_ids"] for case in json.loads(vectors.read_text())["cases"]]
    report = trainer.generate(SkipLM(str(export)), prompts=str(prompts), output=str(work / "out.jsonl"),
                              max_new_tokens=new_tokens)

    model, schedule, tokenizer = load_exported(export)
    batch = collate_prompts(trained_ids, tokenizer.pad_token_id)
    reference = generate_under_schedule(model, batch["prompt_input_ids"], batch["prompt_attention_mask"], schedule,
                                        max_new_tokens=new_tokens, eos_token_id=tokenizer.eos_token_id,
                                        pad_token_id=tokenizer.pad_token_id)
    hf = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True).eval()
    out = hf.generate(sources=sources, tokenizer=tokenizer, max_new_tokens=new_tokens, do_sample=False)
    width = batch["prompt_input_ids"].shape[1]
    lengths = reference.lengths.tolist()
    reference_tokens = [row[:n] for row, n in zip(reference.tokens.tolist(), lengths, strict=True)]
    record = json.loads((export / "skip_schedule.json").read_text())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "command": f"python -m benchmarks.quality.chat_roundtrip --steps {steps} --sources {sources_count} "
                   f"--new_tokens {new_tokens}",
        "machine": f"{cpu_model()}, {os.cpu_count()} cores (shared with other jobs), "
                   f"torch {torch.__version__} CPU",
        "precision": "bf16-mixed (the quickstart's)",
        "model": "smollm2-135m-instruct",
        "fit_steps": steps,
        "fit_wall_s": round(fit_seconds, 1),
        "process_cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "train_loss_last": float(cli.trainer.callback_metrics["train/loss"]),
        "prompt_format": record["prompt_format"],
        "example_prompt_text": tokenizer.decode(trained_ids[0]),
        "sources": sources,
        "conformance_prompt_ids_equal_training": kit_ids == trained_ids,
        "custom_generate_prompt_ids_equal_training": torch.equal(out[:, :width], batch["prompt_input_ids"]),
        "generate_completions_equal_reference": [c.token_ids for c in report.completions] == reference_tokens,
        "custom_generate_completions_equal_reference": all(
            out[row, width:width + n].tolist() == tokens for row, (tokens, n) in
            enumerate(zip(reference_tokens, lengths, strict=True))),
        "completions": [c.completion for c in report.completions],
    }


def main_cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--new_tokens", type=int, default=24)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/smollm2_chat_roundtrip.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = run(args.steps, args.sources, args.new_tokens, Path(work))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.endswith(("equal_training", "equal_reference"))}))


if __name__ == "__main__":
    main_cli()
