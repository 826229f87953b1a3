"""Decode speed of the E2E evidence schedules vs dense: batch 8, the E2E test prompts, 32 new tokens.

    python -m benchmarks.speed.schedules --out benchmarks/results/e2e/speed.json

Speed depends on the schedule, not on the weights (no early stopping: every row generates 32 tokens), so it
is measured once per schedule on the base SmolLM2-135M. Timing: :mod:`benchmarks.common.timing`, dense and every
schedule in ``--rounds`` interleaved rounds (the order rotated) after ``--warmup``, each pass decoding the first
``--batches`` test batches of 8; each speedup over dense is the median of the per-round ratios with its spread.

    python -m benchmarks.speed.schedules --batches 1 --new-tokens 4 --rounds 2 --out runs/schedules.json  # smoke
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.common.study import load_model, study_config, test_prompts
from benchmarks.common.timing import median_wall, run
from skiptrain import Dense, generate_under_schedule
from skiptrain.frontends.prompts import prompt_batches

TRAIN_BASE = "benchmarks/quality/e2e/train_base.yaml"
SCHEDULES = ("skipdecode2x", "skipdecode3x", "hsd2x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="timed interleaved rounds (pairs)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cli = study_config([TRAIN_BASE, "benchmarks/quality/schedules/dense.yaml"])  # the test split of the study's config
    model = load_model(cli, None)
    _, prompts, _ = test_prompts(cli)
    batches = list(prompt_batches(cli.datamodule.tokenizer, prompts, batch_size=8))[: args.batches]
    num_layers = model.config.num_hidden_layers
    schedules = {"dense": Dense().build(num_layers)}
    for name in SCHEDULES:
        family = study_config([TRAIN_BASE, f"benchmarks/quality/schedules/{name}.yaml"]).model.schedule_family
        schedules[name] = family.build(num_layers)

    def decode(schedule) -> list[list[int]]:
        """One pass; its work, the shape of each batch's decoded tokens (no early stopping: equal in every arm)."""
        return [list(generate_under_schedule(model, batch["prompt_input_ids"], batch["prompt_attention_mask"],
                                             schedule, max_new_tokens=args.new_tokens).tokens.shape)
                for batch in batches]

    timing = run({name: lambda s=schedule: decode(s) for name, schedule in schedules.items()}, args.rounds,
                 args.warmup)
    report = timing.report({name: ("dense", name) for name in SCHEDULES})
    new_tokens = sum(len(b["prompt_input_ids"]) for b in batches) * args.new_tokens
    result = {
        "command": "python -m benchmarks.speed.schedules " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                               for k, v in vars(args).items()),
        "batch": 8, "prompts": new_tokens // args.new_tokens, "new_tokens": args.new_tokens,
        "schedules": {
            name: {
                "tokens_per_s": new_tokens / median_wall(timing.passes[name]),
                "ideal_speedup": schedule.sequence_ideal_speedup(args.new_tokens),
            } | ({"measured_speedup": report["comparisons"][name]["wall"]["median"],
                  "claim": report["comparisons"][name]["claim_wall"]} if name != "dense" else {})
            for name, schedule in schedules.items()
        },
        "timing": report,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
