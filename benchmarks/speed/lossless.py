"""Lossless mode evidence on E2E: exactness, acceptance and speed of speculative decoding against full depth.

    python -m benchmarks.speed.lossless exactness --checkpoint CKPT --draft-schedule S.yaml --batch 8 --draft-tokens 4 \
        --out benchmarks/results/e2e/lossless/NAME.json
    python -m benchmarks.speed.lossless timing --checkpoint CKPT --draft-schedule S.yaml --batch 1 --mrs 8 \
        --draft-tokens 2 4 6 --out ...

``exactness`` decodes the MRs of ``--data`` greedily at full depth (``generate`` with every layer) and with
speculative decoding at the same batch size, and counts the outputs that differ; a difference is a near-tie when
the full-depth top-2 logits at its first differing token are closer than 1e-4. It also reports the acceptance, the
tokens per verification and the draft's measured cost ``c`` (a draft step's wall time over a full-depth step's).

``timing`` interleaves passes (full depth, then each K, then full depth again, ...) over the first ``--mrs`` MRs
with end-of-sequence stopping (the outputs are equal, so the work is equal) and keeps each variant's fastest pass.
Run it pinned: ``OMP_NUM_THREADS=1 taskset -c 0``. Every number records the wall and CPU (user + sys) seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

from benchmarks.common.study import load_model, study_config, test_prompts
from skiptrain import Dense, generate_under_schedule
from skiptrain.frontends.prompts import prompt_batches
from skiptrain.frontends.speculative import generate_lossless
from skiptrain.shipped.speculate import SpeculationStats, speedup_bound

TRAIN_BASE = "benchmarks/quality/e2e/train_base.yaml"
TEST_FILE = "../shared/data/e2e/subsets/testset_w_refs_100mr.csv"

NEAR_TIE = 1e-4


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def decode(model, batches, schedule, new_tokens, eos, pad, draft_tokens=None, logits=False):
    """Outputs (token lists), wall and CPU seconds, and for speculative decoding its counts and step seconds."""
    outputs, stats, steps = [], SpeculationStats(), {"prefill": 0.0, "draft": 0.0, "verify": 0.0}
    gaps = []
    wall, cpu = time.perf_counter(), cpu_seconds()
    for batch in batches:
        ids, mask = batch["prompt_input_ids"], batch["prompt_attention_mask"]
        if draft_tokens is None:
            out = generate_under_schedule(model, ids, mask, schedule, new_tokens, eos_token_id=eos, pad_token_id=pad,
                                          return_logits=logits)
            if logits:
                top2 = out.logits.topk(2, dim=-1).values
                gaps += list(top2[..., 0] - top2[..., 1])  # [G] per row
        else:
            out = generate_lossless(model, ids, mask, schedule, new_tokens, draft_tokens, eos_token_id=eos,
                                    pad_token_id=pad)
            stats = stats.add(out.stats)
            for name in steps:
                steps[name] += getattr(out.seconds, name)
        outputs += [row[:n] for row, n in zip(out.tokens.tolist(), out.lengths.tolist(), strict=True)]
    return {"outputs": outputs, "wall_s": time.perf_counter() - wall, "cpu_s": cpu_seconds() - cpu,
            "stats": stats, "steps": steps, "gaps": gaps}


def speculation_summary(run: dict, draft_tokens: int, dense_step_s: float) -> dict:
    stats = run["stats"]
    c = run["steps"]["draft"] / stats.draft_steps / dense_step_s if stats.draft_steps else 0.0
    return {
        "draft_tokens": draft_tokens,
        "acceptance": stats.acceptance_rate,
        "accepted": stats.accepted, "judged": stats.judged,
        "tokens_per_verification": stats.tokens_per_verification,
        "draft_cost_c": c,
        "verify_cost": run["steps"]["verify"] / stats.verifications / dense_step_s,
        "bound": speedup_bound(stats.acceptance_rate, draft_tokens, c),
    }


def dense_step_seconds(model, batches, new_tokens, pad) -> float:
    """One full-depth step's wall time: speculative decoding with no drafts, every verification one column."""
    run = decode(model, batches[:1], Dense().build(model.config.num_hidden_layers), new_tokens, None, pad, 0)
    return run["steps"]["verify"] / run["stats"].verifications


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["exactness", "timing"])
    parser.add_argument("--checkpoint", default=None, help="a fit run's last.ckpt (default: the base model)")
    parser.add_argument("--config", default=TRAIN_BASE, help="the study's training config (model, prompt format)")
    parser.add_argument("--draft-schedule", type=Path, required=True, help="a config fragment with model.schedule")
    parser.add_argument("--data", default=TEST_FILE)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--mrs", type=int, default=None, help="first N MRs only")
    parser.add_argument("--draft-tokens", type=int, nargs="+", default=[4])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cli = study_config([args.config, str(args.draft_schedule)], args.data)
    model = load_model(cli, args.checkpoint)
    tokenizer = cli.datamodule.tokenizer
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    num_layers = model.config.num_hidden_layers
    draft = cli.model.schedule_family.build(num_layers)
    dense = Dense().build(num_layers)
    prompts = test_prompts(cli)[1][: args.mrs]
    batches = list(prompt_batches(tokenizer, prompts, args.batch))
    decode(model, batches[:1], dense, 2, eos, pad)  # warm-up
    result = {
        "command": "python -m benchmarks.speed.lossless " + " ".join(sys.argv[1:]),
        "machine": "2-core Intel Xeon (AVX512-BF16), shared with other jobs; torch " + torch.__version__,
        "precision": "fp32", "threads": args.threads, "checkpoint": args.checkpoint or "base (no fine-tuning)",
        "draft_schedule": {"file": str(args.draft_schedule), "family": draft.family, "params": draft.params,
                           "mean_layers_per_token": draft.mean_layers_per_token()},
        "data": args.data, "batch": args.batch, "mrs": sum(len(b["prompt_input_ids"]) for b in batches),
        "new_tokens": args.new_tokens,
    }
    if args.mode == "exactness":
        reference = decode(model, batches, dense, args.new_tokens, eos, pad, logits=True)
        step = dense_step_seconds(model, batches, 16, pad)
        result["dense"] = {"wall_s": reference["wall_s"], "cpu_s": reference["cpu_s"],
                           "tokens": sum(map(len, reference["outputs"]))}
        result["speculative"] = []
        for k in args.draft_tokens:
            run = decode(model, batches, draft, args.new_tokens, eos, pad, k)
            differing = near_ties = 0
            for row, (mine, theirs) in enumerate(zip(run["outputs"], reference["outputs"], strict=True)):
                if mine == theirs:
                    continue
                differing += 1
                first = next((g for g, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                             min(len(mine), len(theirs)))
                near_ties += bool(first < len(reference["gaps"][row]) and reference["gaps"][row][first] < NEAR_TIE)
            result["speculative"].append({
                **speculation_summary(run, k, step), "differing_outputs": differing,
                "differing_at_near_ties": near_ties, "wall_s": run["wall_s"], "cpu_s": run["cpu_s"],
                "speedup_wall": reference["wall_s"] / run["wall_s"],
            })
    else:
        variants = [None, *args.draft_tokens]
        runs: dict[str, list[dict]] = {str(k or "dense"): [] for k in variants}
        for _ in range(args.passes):
            for k in variants:
                runs[str(k or "dense")].append(decode(model, batches, dense if k is None else draft, args.new_tokens,
                                                      eos, pad, k))
        fastest = {name: min(passes, key=lambda r: r["wall_s"]) for name, passes in runs.items()}
        step = dense_step_seconds(model, batches, 16, pad)
        dense_run = fastest["dense"]
        assert all(r["outputs"] == dense_run["outputs"] for r in fastest.values()), "speculative output differs"
        result["dense"] = {"wall_s": dense_run["wall_s"], "cpu_s": dense_run["cpu_s"],
                           "tokens": sum(map(len, dense_run["outputs"])),
                           "passes_wall_s": [r["wall_s"] for r in runs["dense"]]}
        result["speculative"] = [{
            **speculation_summary(fastest[str(k)], k, step), "wall_s": fastest[str(k)]["wall_s"],
            "cpu_s": fastest[str(k)]["cpu_s"], "passes_wall_s": [r["wall_s"] for r in runs[str(k)]],
            "speedup": dense_run["wall_s"] / fastest[str(k)]["wall_s"],
            "speedup_cpu": dense_run["cpu_s"] / fastest[str(k)]["cpu_s"],
        } for k in args.draft_tokens]
        for row in result["speculative"]:
            row["speedup_over_bound"] = row["speedup"] / row["bound"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
