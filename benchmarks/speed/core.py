"""Core benchmark: training forward+backward and KV-cached decode throughput, skip vs dense.

Model: a random Llama with SmolLM2-135M's shape (30 layers, hidden 576, vocab 49152, tied embeddings),
so the numbers describe the real layer/head balance of that model. Schedule: SkipDecode picked by
``skipdecode_for_speedup`` for an ideal 2x decode speedup over 128 generated tokens.

Reports, for each measurement, the measured speedup (dense time / skip time) next to the ideal
decoder-layer-FLOP speedup, for the decoder layers alone (``skip_hidden_states``) and for the whole model
(LM head and loss included, which skipping cannot reduce).

    python -m benchmarks.speed.core --out benchmarks/results/core_cpu.json [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.common.machine import describe
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


def timed(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def train_step(model, ids, mask, schedule, prompt_length, layers_only: bool) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--train-generated", type=int, default=240)
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--decode-prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    parser.add_argument("--parts", default="train,decode", help="comma-separated: train, decode")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dtype = getattr(torch, args.dtype)
    model = smollm2_shaped_model(args.attn).to(dtype)
    num_layers = model.config.num_hidden_layers
    family = skipdecode_for_speedup(num_layers, 2.0, decay_tokens=args.new_tokens, generation_length=args.new_tokens)
    skip = family.build(num_layers)
    dense = Dense().build(num_layers)
    results: dict = {
        "command": "python -m benchmarks.speed.core " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        ),
        "machine": describe(),
        "model": "random Llama, SmolLM2-135M shape (30 layers, hidden 576, vocab 49152)",
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
            seconds = {
                name: timed(lambda s=s, lo=layers_only: train_step(model, ids, mask, s, args.prompt_length, lo),
                            args.repeats)
                for name, s in (("dense", dense), ("skip", skip))
            }
            train[scope] = {
                "dense_tokens_per_s": ids.numel() / seconds["dense"],
                "skip_tokens_per_s": ids.numel() / seconds["skip"],
                "measured_speedup": seconds["dense"] / seconds["skip"],
            }
            train[scope]["fraction_of_ideal"] = train[scope]["measured_speedup"] / ideal_train
            print(scope, json.dumps(train[scope]), flush=True)
        results["train_forward_backward"] = train

    if "decode" in parts:
        # -- KV-cached decoding ---------------------------------------------------------------------------------
        model.eval()
        shape = (args.decode_batch, args.decode_prompt)
        prompts = torch.randint(3, model.config.vocab_size, shape, generator=generator)
        prompt_mask = torch.ones_like(prompts)
        ideal_decode = skip.sequence_ideal_speedup(args.new_tokens)

        def decode(schedule, new_tokens):
            return generate_under_schedule(model, prompts, prompt_mask, schedule, max_new_tokens=new_tokens)

        decode_results = {
            "batch": args.decode_batch, "prompt_length": args.decode_prompt, "new_tokens": args.new_tokens,
            "mean_layers_per_token": skip.mean_layers_per_token(args.new_tokens), "ideal_speedup": ideal_decode,
        }
        # end to end includes the (dense-depth) prefill; the decode phase is that minus a 1-token generation
        for name, s in (("dense", dense), ("skip", skip)):
            full = timed(lambda s=s: decode(s, args.new_tokens), args.repeats)
            prefill = timed(lambda s=s: decode(s, 1), args.repeats)
            decode_results[f"{name}_end_to_end_tokens_per_s"] = args.decode_batch * args.new_tokens / full
            decode_results[f"{name}_decode_phase_tokens_per_s"] = args.decode_batch * (args.new_tokens - 1) / (
                full - prefill)
        for phase in ("end_to_end", "decode_phase"):
            speedup = decode_results[f"skip_{phase}_tokens_per_s"] / decode_results[f"dense_{phase}_tokens_per_s"]
            decode_results[f"{phase}_speedup"] = speedup
            decode_results[f"{phase}_fraction_of_ideal"] = speedup / ideal_decode
        results["decode"] = decode_results
        print("decode", json.dumps(decode_results), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
