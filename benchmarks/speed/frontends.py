"""Side by side: decode tokens/s of transformers and skiptrain, dense and under a 2x schedule.

Four front-ends decode the same random prompts for the same number of tokens (no end-of-sequence stop):

- ``hf_dense``: transformers ``model.generate`` (greedy);
- ``skiptrain_dense``: :func:`skiptrain.generate_under_schedule` with every layer;
- ``skiptrain_skip``: :func:`skiptrain.generate_under_schedule` under the schedule;
- ``hf_skip``: transformers ``generate`` through an export's ``custom_generate/generate.py``, loaded by transformers'
  own ``load_custom_generate`` (what ``from_pretrained(..., trust_remote_code=True)`` installs), same schedule.

Model: a random Llama of SmolLM2-135M's shape (``bench_core.smollm2_shaped_model``); schedule: SkipDecode for an ideal
2x over the generated tokens (as ``core.py``). For each batch size the four run in interleaved rounds
(:mod:`benchmarks.common.timing`: one pass of each per round, the order rotated, ``--warmup`` rounds first); every
speedup is the median of the per-round ratios with its spread, tokens/s are over the median pass. Each skip speedup
is also reported as a fraction of the parameter-read limit (dense parameters read per generated token over the
schedule's, LM head included: :func:`skiptrain.core.speedup.parameter_read_speedup`).

    taskset -c 1 python -m benchmarks.speed.frontends --threads 1 --out benchmarks/results/frontends_cpu_1thread.json
    python -m benchmarks.speed.frontends --layers 2 --batches 1 --new-tokens 4 --rounds 2 --out runs/frontends.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.common.custom_generate import export_generate
from benchmarks.common.timing import median_wall, run
from benchmarks.speed.core import smollm2_shaped_model
from skiptrain import Dense, generate_under_schedule, skipdecode_for_speedup
from skiptrain.core.speedup import parameter_read_speedup
from skiptrain.frontends.speed import parameter_counts

FRONTENDS = ("hf_dense", "skiptrain_dense", "skiptrain_skip", "hf_skip")
COMPARISONS = {  # name: (baseline, candidate)
    "skiptrain_skip_speedup": ("skiptrain_dense", "skiptrain_skip"),
    "hf_skip_speedup": ("hf_dense", "hf_skip"),
    "skiptrain_dense_vs_hf_dense": ("hf_dense", "skiptrain_dense"),
    "hf_skip_vs_skiptrain_skip": ("skiptrain_skip", "hf_skip"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", default="5", help="timed interleaved rounds: one number, or one per batch size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers, for a quick smoke run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = smollm2_shaped_model("sdpa", num_layers=args.layers).to(args.device, getattr(torch, args.dtype)).eval()
    num_layers = model.config.num_hidden_layers
    skip = skipdecode_for_speedup(num_layers, 2.0, decay_tokens=args.new_tokens,
                                  generation_length=args.new_tokens).build(num_layers)
    dense = Dense().build(num_layers)
    model.generation_config.eos_token_id = None  # every row decodes --new-tokens tokens
    hf_skip_generate = export_generate(model, skip)

    def decode(frontend: str, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        mask = torch.ones_like(ids)
        common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        if frontend == "hf_dense":
            return model.generate(**common)[:, ids.shape[1]:]
        if frontend == "hf_skip":
            return hf_skip_generate(model=model, **common)[:, ids.shape[1]:]
        schedule = skip if frontend == "skiptrain_skip" else dense
        return generate_under_schedule(model, ids, mask, schedule, max_new_tokens=new_tokens).tokens

    def timed_pass(frontend: str, ids: torch.Tensor) -> list[int]:
        """One timed decode; its work is the shape of what it decoded (every front-end decodes the same count)."""
        tokens = decode(frontend, ids, args.new_tokens)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        assert tokens.shape == (ids.shape[0], args.new_tokens), f"{frontend} decoded {tuple(tokens.shape)}"
        return list(tokens.shape)

    generator = torch.Generator().manual_seed(0)
    limit = parameter_read_speedup(skip, [args.new_tokens], *parameter_counts(model))
    results: dict = {
        "command": "python -m benchmarks.speed.frontends " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "device": args.device,
        "model": f"random Llama, SmolLM2-135M shape ({num_layers} layers, hidden 576, vocab 49152)",
        "dtype": args.dtype,
        "schedule": {"family": skip.family, "params": skip.params},
        "prompt_length": args.prompt_length, "new_tokens": args.new_tokens,
        "decoder_layers_ideal_speedup": skip.sequence_ideal_speedup(args.new_tokens),
        "parameter_read_limit": limit,
        "batches": {},
    }
    batches = [int(b) for b in args.batches.split(",")]
    rounds = [int(p) for p in args.rounds.split(",")]
    rounds = rounds * len(batches) if len(rounds) == 1 else rounds
    if len(rounds) != len(batches):
        parser.error(f"--rounds {args.rounds}: allowed one number or one per batch size ({len(batches)})")
    for batch, batch_rounds in zip(batches, rounds, strict=True):
        ids = torch.randint(3, model.config.vocab_size, (batch, args.prompt_length), generator=generator)
        ids = ids.to(args.device)
        hf, own = decode("hf_skip", ids, 16), decode("skiptrain_skip", ids, 16)
        agreement = (hf == own).float().mean().item()  # bf16 rounding may flip a near tie
        assert agreement == 1 or args.dtype != "float32", "the custom generate decodes what skiptrain decodes"
        timing = run({name: lambda name=name, ids=ids: timed_pass(name, ids) for name in FRONTENDS}, batch_rounds,
                     args.warmup, label=f"batch {batch} ")
        report = timing.report(COMPARISONS)
        tokens = batch * args.new_tokens
        row = {"rounds": batch_rounds, "hf_skip_token_agreement_first_16": agreement}
        row |= {f"{name}_tokens_per_s": tokens / median_wall(timing.passes[name]) for name in FRONTENDS}
        for name in COMPARISONS:
            row[name] = report["comparisons"][name]["wall"]["median"]
            row[f"{name}_claim"] = report["comparisons"][name]["claim_wall"]
        row["skiptrain_skip_fraction_of_limit"] = row["skiptrain_skip_speedup"] / limit
        row["hf_skip_fraction_of_limit"] = row["hf_skip_speedup"] / limit
        print(f"batch {batch}", json.dumps(row), flush=True)
        results["batches"][str(batch)] = row | {"timing": report}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


def table(results: dict) -> str:
    """The RESULTS.md table of a results file: median tokens/s, and each speedup as its claim (median and spread)."""
    lines = ["| batch (rounds) | HF dense | skiptrain dense | skiptrain 2x | HF `custom_generate` 2x | skiptrain 2x "
             "speedup (of limit) | HF 2x speedup (of limit) | skiptrain dense / HF dense | HF 2x / skiptrain 2x |",
             "|---|---|---|---|---|---|---|---|---|"]
    for batch, r in results["batches"].items():
        lines.append(
            f"| {batch} ({r['rounds']}) | {r['hf_dense_tokens_per_s']:.1f} | {r['skiptrain_dense_tokens_per_s']:.1f} | "
            f"{r['skiptrain_skip_tokens_per_s']:.1f} | {r['hf_skip_tokens_per_s']:.1f} | "
            f"{r['skiptrain_skip_speedup_claim']} ({r['skiptrain_skip_fraction_of_limit']:.0%}) | "
            f"{r['hf_skip_speedup_claim']} ({r['hf_skip_fraction_of_limit']:.0%}) | "
            f"{r['skiptrain_dense_vs_hf_dense_claim']} | {r['hf_skip_vs_skiptrain_skip_claim']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
