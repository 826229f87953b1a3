"""Core benchmark: training forward+backward and KV-cached decode throughput, skip vs dense.

Model: a random Llama with SmolLM2-135M's shape (30 layers, hidden 576, vocab 49152, tied embeddings),
so the numbers describe the real layer/head balance of that model. Schedule: SkipDecode picked by
``skipdecode_for_speedup`` for an ideal 2x decode speedup over 128 generated tokens.

Reports, for each measurement, the measured speedup (dense time / skip time) next to the ideal
decoder-layer-FLOP speedup, for the decoder layers alone (``skip_hidden_states``) and for the whole model
(LM head and loss included, which skipping cannot reduce). Timing: :mod:`benchmarks.common.timing` (``--rounds``
interleaved rounds of dense and skip after ``--warmup``; the median per-round ratio with its spread, every pass
kept). Decoding times the whole decode and a one-token decode (its prefill) in each round; the decode phase is their
difference, round by round.

    taskset -c 1 python -m benchmarks.speed.core --threads 1 --out benchmarks/results/core_cpu_1thread.json
    python -m benchmarks.speed.core --layers 2 --new-tokens 8 --rounds 2 --out runs/core_smoke.json  # a smoke run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.common.timing import claims, compare, median_wall, run
from skiptrain import Dense, generate_under_schedule, skip_forward, skip_hidden_states, skipdecode_for_speedup


def smollm2_shaped_model(attn: str, num_layers: int | None = None) -> torch.nn.Module:
    """A random Llama of SmolLM2-135M's shape (``num_layers`` overrides its 30 layers, for smoke runs)."""
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=num_layers or 30,
        num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True, rope_theta=100000.0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def train_step(model, ids, mask, schedule, prompt_length, layers_only: bool) -> int:
    """One forward + backward under ``schedule``; its work, the number of tokens, for the same-work check."""
    model.zero_grad(set_to_none=True)
    if layers_only:
        out = skip_hidden_states(model, ids, mask, schedule, prompt_length)
        loss = out.float().pow(2).mean()
    else:
        logits = skip_forward(model, ids, mask, schedule, prompt_length)
        targets = ids[:, prompt_length:]
        loss = torch.nn.functional.cross_entropy(
            logits[:, prompt_length - 1 : -1].flatten(0, 1).float(), targets.flatten()
        )
    loss.backward()
    return ids.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--train-generated", type=int, default=240)
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--decode-prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5, help="timed interleaved rounds (pairs)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers, for a quick smoke run")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--parts", default="train,decode", help="comma-separated: train, decode")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dtype = getattr(torch, args.dtype)
    model = smollm2_shaped_model(args.attn, num_layers=args.layers).to(dtype)
    num_layers = model.config.num_hidden_layers
    family = skipdecode_for_speedup(num_layers, 2.0, decay_tokens=args.new_tokens, generation_length=args.new_tokens)
    skip = family.build(num_layers)
    dense = Dense().build(num_layers)
    results: dict = {
        "command": "python -m benchmarks.speed.core " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None
        ),
        "model": f"random Llama, SmolLM2-135M shape ({num_layers} layers, hidden 576, vocab 49152)",
        "dtype": args.dtype,
        "schedule": {"family": skip.family, "params": skip.params},
    }

    parts = set(args.parts.split(","))
    generator = torch.Generator().manual_seed(0)
    if "train" in parts:
        # -- training forward + backward ----------------------------------------------------------------------
        model.train()
        columns = args.prompt_length + args.train_generated
        ids = torch.randint(3, model.config.vocab_size, (args.train_batch, columns), generator=generator)
        mask = torch.ones_like(ids)
        ideal_train = 1 / skip.layer_flop_fraction(args.prompt_length, args.train_generated)
        train = {"batch": args.train_batch, "prompt_length": args.prompt_length,
                 "generated_columns": args.train_generated, "ideal_layer_flop_speedup": ideal_train}
        for scope, layers_only in (("decoder_layers", True), ("whole_model", False)):
            timing = run({name: lambda s=s, lo=layers_only: train_step(model, ids, mask, s, args.prompt_length, lo)
                          for name, s in (("dense", dense), ("skip", skip))},
                         args.rounds, args.warmup, label=f"train {scope} ")
            report = timing.report({"skip_speedup": ("dense", "skip")})
            speedup = report["comparisons"]["skip_speedup"]
            train[scope] = {
                "dense_tokens_per_s": ids.numel() / median_wall(timing.passes["dense"]),
                "skip_tokens_per_s": ids.numel() / median_wall(timing.passes["skip"]),
                "measured_speedup": speedup["wall"]["median"], "claim": speedup["claim_wall"],
                "fraction_of_ideal": speedup["wall"]["median"] / ideal_train,
                "timing": report,
            }
            print(scope, json.dumps({k: v for k, v in train[scope].items() if k != "timing"}), flush=True)
        results["train_forward_backward"] = train

    if "decode" in parts:
        # -- KV-cached decoding ---------------------------------------------------------------------------------
        model.eval()
        shape = (args.decode_batch, args.decode_prompt)
        prompts = torch.randint(3, model.config.vocab_size, shape, generator=generator)
        prompt_mask = torch.ones_like(prompts)
        ideal_decode = skip.sequence_ideal_speedup(args.new_tokens)

        def decode(schedule, new_tokens):
            tokens = generate_under_schedule(model, prompts, prompt_mask, schedule, max_new_tokens=new_tokens).tokens
            return list(tokens.shape)  # the work: every row decodes new_tokens tokens

        decode_results = {
            "batch": args.decode_batch, "prompt_length": args.decode_prompt, "new_tokens": args.new_tokens,
            "mean_layers_per_token": skip.mean_layers_per_token(args.new_tokens), "ideal_speedup": ideal_decode,
        }
        # end to end includes the (dense-depth) prefill; the decode phase is that minus a 1-token decode
        timing = run({f"{name}{part}": lambda s=s, n=n: decode(s, n)
                      for name, s in (("dense", dense), ("skip", skip))
                      for part, n in (("", args.new_tokens), ("_prefill", 1))},
                     args.rounds, args.warmup, label="decode ")
        report = timing.report({"end_to_end": ("dense", "skip")})
        phases = {name: [whole.minus(prefill) for whole, prefill in
                         zip(timing.passes[name], timing.passes[f"{name}_prefill"], strict=True)]
                  for name in ("dense", "skip")}
        report["comparisons"]["decode_phase"] = {"baseline": "dense - dense_prefill",
                                                 "candidate": "skip - skip_prefill",
                                                 **claims(compare(phases["dense"], phases["skip"]))}
        for phase, passes, tokens in (("end_to_end", timing.passes, args.new_tokens),
                                      ("decode_phase", phases, args.new_tokens - 1)):
            speedup = report["comparisons"][phase]
            for name in ("dense", "skip"):
                decode_results[f"{name}_{phase}_tokens_per_s"] = args.decode_batch * tokens / median_wall(
                    passes[name])
            decode_results[f"{phase}_speedup"] = speedup["wall"]["median"]
            decode_results[f"{phase}_claim"] = speedup["claim_wall"]
            decode_results[f"{phase}_fraction_of_ideal"] = speedup["wall"]["median"] / ideal_decode
        print("decode", json.dumps(decode_results), flush=True)
        decode_results["timing"] = report
        results["decode"] = decode_results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
