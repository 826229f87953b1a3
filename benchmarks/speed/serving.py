"""Serving speed of an export in vLLM under its schedule (the skiptrain plugin) vs vLLM dense, and skiptrain's decoder.

The same E2E test prompts (the export's recorded prompt format), ``--new-tokens`` greedy tokens each (no
end-of-sequence stop), submitted ``c`` at a time for each concurrency ``c``: tokens/s over the whole ``generate``
call (prefill included). Each engine runs in a process of its own, both at once, taking turns through the folder
``TURNS`` (vLLM needs its own venv: docs/serving.md), and a last step joins the parts with the parameter-read limit
of the schedule (:func:`skiptrain.core.speedup.parameter_read_speedup`):

    python -m benchmarks.speed.serving vllm --export EXPORT --mode skip --turns TURNS --out skip.json &  # vLLM venv
    python -m benchmarks.speed.serving vllm --export EXPORT --mode dense --turns TURNS --out dense.json  # vLLM venv
    python -m benchmarks.speed.serving skiptrain --export EXPORT --out own.json                # the tested venv
    python -m benchmarks.speed.serving join --export EXPORT --parts skip.json dense.json own.json \\
        --out benchmarks/results/serving/smollm2_e2e_joint_flat2x_prefix_off_run1.json        # the tested venv

``--prefix-caching on`` (both vLLM steps; the join refuses parts that differ) times vLLM's prefix caching: every
round after the first finds the prompts' full KV blocks cached and prefills only the rest. Only full blocks are
reused: vLLM's CPU blocks hold 128 tokens, more than these prompts (34-63 tokens), so ``--block-size 32`` gives
them a block to reuse.

Timing: :mod:`benchmarks.common.timing`. Each concurrency is timed in ``--rounds`` rounds after ``--warmup`` untimed
ones (and the engine start); the speedup is the median of the per-round ratios dense s / plugin s with its spread,
in wall and CPU time (the engine runs in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; otherwise its CPU time
is not measured), and every pass's numbers are kept. The two vLLM steps run at once with ``--turns DIR`` (a fresh
folder, the same for both; the ``skip`` step started first): both engines stay up, but only one works at a time,
and they take turns in the protocol's order: engine starts skip then dense, then each round's concurrencies in the
round's order, which alternates from round to round (dense first, then skip first, ...), so no engine always goes
first and drift in the machine's speed hits both alike. Without ``--turns`` the join still pairs the steps' passes
round by round, but they were not interleaved (the result says ``"interleaved": false``). Engines run in-process:
on a busy core a step can outlast vLLM's RPC timeout. The skiptrain step interleaves its own dense and skip passes.

    python -m benchmarks.speed.serving skiptrain --export EXPORT --concurrency 1 --new-tokens 4 --rounds 1 \\
        --out runs/serving_own.json  # a smoke run of the skiptrain step
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.common.machine import describe
from benchmarks.common.timing import Done, Pass, claims, compare, measure, median_wall, order, run

ENGINES = ("skip", "dense")

PROMPTS_CSV = "../shared/data/e2e/subsets/testset_w_refs_100mr.csv"


def sources(count: int) -> list[str]:
    """The first ``count`` distinct meaning representations of the E2E test subset."""
    with open(PROMPTS_CSV, newline="") as handle:
        return list(dict.fromkeys(row["mr"] for row in csv.DictReader(handle)))[:count]


def prompt_ids(export: Path, count: int) -> list[list[int]]:
    """The prompts training made from the first ``count`` test sources (the export's recorded prompt format)."""
    from transformers import AutoTokenizer

    from skiptrain.shipped.prompt_format import PromptFormat

    recorded = json.loads((export / "skip_schedule.json").read_text())["prompt_format"]
    return PromptFormat.from_dict(recorded).encode(AutoTokenizer.from_pretrained(str(export)), sources(count))[1]


class Turns:
    """Two processes taking turns through a file in ``folder``: turn ``t`` of the shared ``schedule`` (a list of
    names) belongs to ``schedule[t]``, and the file holds the number of the turn now due. ``None``: no partner,
    every turn is ours."""

    def __init__(self, folder: Path | None, mine: str, schedule: list[str]) -> None:
        self.file = folder / "turn" if folder else None
        self.mine = iter(t for t, name in enumerate(schedule) if name == mine)
        self.turn = -1
        if self.file is not None and schedule[0] == mine:
            self.file.write_text("0")

    def __enter__(self) -> None:
        self.turn = next(self.mine)
        while self.file is not None and (not self.file.is_file() or self.file.read_text() != str(self.turn)):
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.write_text(str(self.turn + 1))


def turn_schedule(rounds: int, concurrencies: list[int]) -> list[str]:
    """Who works in each turn: engine starts (round 0's order), then each later round's concurrencies in its order."""
    return [*order(ENGINES, 0), *(name for index in range(1, rounds + 1) for _ in concurrencies
                                 for name in order(ENGINES, index))]


def run_vllm(args: argparse.Namespace) -> dict:
    """Tokens/s of one vLLM engine (``--mode skip``: the plugin's class; ``dense``: vLLM's own) per concurrency."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    import vllm
    from vllm import LLM, SamplingParams, TokensPrompt

    from skiptrain.serving.vllm_plugin import hf_overrides

    rounds = args.warmup + args.rounds
    turn = Turns(args.turns, args.mode, turn_schedule(rounds, args.concurrency))
    in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids(args.export, max(args.concurrency))]
    sampling = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    with turn:
        started = time.perf_counter()
        llm = LLM(model=str(args.export), dtype=args.dtype, enforce_eager=True,
                  enable_prefix_caching=args.prefix_caching == "on",
                  max_model_len=512, kv_cache_memory_bytes=256 << 20, seed=0,
                  **({"block_size": args.block_size} if args.block_size else {}),
                  **({"hf_overrides": hf_overrides(args.export)} if args.mode == "skip" else {}))
        startup = time.perf_counter() - started
    load_before = list(os.getloadavg())
    passes: dict[int, list[Pass]] = {c: [] for c in args.concurrency}
    outputs = {}

    def generate(concurrency: int) -> object:
        """One pass; its work, each request's token count (``--new-tokens`` in both engines)."""
        done = llm.generate(prompts[:concurrency], sampling, use_tqdm=False)
        outputs[str(concurrency)] = [list(out.outputs[0].token_ids) for out in done]
        work = [len(tokens) for tokens in outputs[str(concurrency)]]
        return work if in_process else Done(work, cpu_s=None)  # an engine process's CPU time is not ours

    for index in range(rounds):
        for concurrency in args.concurrency:
            with turn:
                done = measure(lambda c=concurrency: generate(c))
            if index >= args.warmup:
                passes[concurrency].append(done)
                print(f"vllm {args.mode} c={concurrency} round {index - args.warmup + 1}/{args.rounds}: "
                      f"{done.wall_s:.2f} s wall, {done.cpu_s} s CPU", flush=True)
    rows = {str(c): {"tokens_per_s": c * args.new_tokens / median_wall(timed), "passes": [asdict(p) for p in timed]}
            for c, timed in passes.items()}
    return {"frontend": f"vllm_{args.mode}", "vllm": vllm.__version__, "torch": torch.__version__,
            "prefix_caching": args.prefix_caching, "block_size": llm.llm_engine.vllm_config.cache_config.block_size,
            "engine_start_seconds": startup, "turns": turn_schedule(rounds, args.concurrency) if args.turns else None,
            "load_average_before": load_before, "load_average_after": list(os.getloadavg()),
            "concurrency": rows, "token_ids": outputs}


def run_skiptrain(args: argparse.Namespace) -> dict:
    """Tokens/s of skiptrain's own batched decoder under the schedule and dense, one batch per concurrency."""
    import torch

    from skiptrain import Dense, generate_under_schedule
    from skiptrain.export.load import load_exported
    from skiptrain.text.batch import collate_prompts

    model, schedule, tokenizer = load_exported(args.export, dtype=getattr(torch, args.dtype))
    ids = prompt_ids(args.export, max(args.concurrency))
    dense = Dense().build(schedule.num_layers)

    def decode(batch: dict, chosen, new_tokens: int) -> torch.Tensor:
        return generate_under_schedule(model, batch["prompt_input_ids"], batch["prompt_attention_mask"], chosen,
                                       max_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id).tokens

    rows, outputs = {}, {}
    for concurrency in args.concurrency:
        batch = collate_prompts(ids[:concurrency], tokenizer.pad_token_id)

        def one_pass(name: str, chosen, batch=batch, concurrency=concurrency) -> list[int]:
            tokens = decode(batch, chosen, args.new_tokens)
            if name == "skip":
                outputs[str(concurrency)] = tokens.tolist()
            return list(tokens.shape)  # the work: every row decodes --new-tokens tokens

        timing = run({name: lambda name=name, chosen=chosen: one_pass(name, chosen)
                      for name, chosen in (("skip", schedule), ("dense", dense))},
                     args.rounds, args.warmup, label=f"skiptrain c={concurrency} ")
        report = timing.report({"skip_speedup": ("dense", "skip")})
        rows[str(concurrency)] = {f"{name}_tokens_per_s": concurrency * args.new_tokens / median_wall(passes)
                                  for name, passes in timing.passes.items()} | {"timing": report}
    return {"frontend": "skiptrain", "torch": torch.__version__, "concurrency": rows, "token_ids": outputs}


def join(args: argparse.Namespace) -> dict:
    """The result file: every part, speedups and the schedule's parameter-read limit."""
    from skiptrain.core.speedup import parameter_read_speedup
    from skiptrain.export.load import load_exported
    from skiptrain.frontends.speed import parameter_counts

    model, schedule, _ = load_exported(args.export)
    parts = {part["frontend"]: part for part in (json.loads(Path(p).read_text()) for p in args.parts)}
    skip, dense, own = parts["vllm_skip"], parts["vllm_dense"], parts.get("skiptrain")
    cache = [(part["prefix_caching"], part.get("block_size")) for part in (skip, dense)]  # None: vLLM's default
    if cache[0] != cache[1]:
        raise SystemExit(f"the vLLM parts differ in (prefix caching, block size): skip {cache[0]}, dense {cache[1]}")
    result = {
        "commands": [part["command"] for part in parts.values()],
        "machine": parts["vllm_skip"]["machine"],
        "export": {"name": args.export.name, "schedule": schedule.family,
                   "base_model": json.loads((args.export / "skip_schedule.json").read_text())["base_model"],
                   "layers_per_generated_token": schedule.mean_layers_per_token(args.new_tokens),
                   "num_layers": schedule.num_layers},
        "dtype": args.dtype, "new_tokens": args.new_tokens, "prompts": f"E2E test sources ({PROMPTS_CSV})",
        "timing": "median of interleaved rounds after a warm-up (benchmarks/common/timing.py); tokens/s over the "
                  "whole generate call at the median pass",
        "interleaved": skip["turns"] is not None and dense["turns"] is not None, "turns": skip["turns"],
        "load_average": {name: [part["load_average_before"], part["load_average_after"]]
                         for name, part in (("skip", skip), ("dense", dense))},
        "vllm": skip["vllm"], "torch": skip["torch"], "prefix_caching": skip["prefix_caching"],
        "block_size": skip.get("block_size"),
        "engine_start_seconds": {"skip": skip["engine_start_seconds"], "dense": dense["engine_start_seconds"]},
        "concurrency": {},
    }
    for concurrency, row in skip["concurrency"].items():
        c = int(concurrency)
        limit = parameter_read_speedup(schedule, [args.new_tokens] * c, *parameter_counts(model))
        speedup = claims(compare([Pass(**p) for p in dense["concurrency"][concurrency]["passes"]],
                                 [Pass(**p) for p in row["passes"]]))
        entry = {
            "vllm_skip_tokens_per_s": row["tokens_per_s"],
            "vllm_dense_tokens_per_s": dense["concurrency"][concurrency]["tokens_per_s"],
            "layer_count_limit": schedule.num_layers / schedule.mean_layers_per_token(args.new_tokens),
            "parameter_read_limit": limit,
            "vllm_skip_speedup": speedup["wall"]["median"] if "wall" in speedup else None,
            "vllm_skip_speedup_claim": speedup["claim_wall"],
        }
        entry["vllm_skip_fraction_of_limit"] = entry["vllm_skip_speedup"] / limit if "wall" in speedup else None
        if own is not None:
            mine = own["concurrency"][concurrency]
            agree = [a == b for x, y in zip(skip["token_ids"][concurrency], own["token_ids"][concurrency], strict=True)
                     for a, b in zip(x, y, strict=True)]
            entry |= {"skiptrain_skip_tokens_per_s": mine["skip_tokens_per_s"],
                      "skiptrain_dense_tokens_per_s": mine["dense_tokens_per_s"],
                      "skiptrain_skip_speedup": mine["timing"]["comparisons"]["skip_speedup"]["wall"]["median"],
                      "skiptrain_skip_speedup_claim": mine["timing"]["comparisons"]["skip_speedup"]["claim_wall"],
                      "vllm_skip_vs_skiptrain_skip": entry["vllm_skip_tokens_per_s"] / mine["skip_tokens_per_s"],
                      "vllm_skip_token_agreement_with_skiptrain": sum(agree) / len(agree)}
        entry["vllm_skip_vs_dense"] = speedup | {"baseline": "vllm_dense", "candidate": "vllm_skip"}
        entry["passes"] = {"vllm_skip": row["passes"], "vllm_dense": dense["concurrency"][concurrency]["passes"]}
        result["concurrency"][concurrency] = entry
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["vllm", "skiptrain", "join"])
    parser.add_argument("--export", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mode", choices=["skip", "dense"], default="skip")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (pairs) per concurrency")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--prefix-caching", choices=["on", "off"], default="off",
                        help="vLLM's prefix caching (on: the rounds after the first reuse the prompts' full KV blocks)")
    parser.add_argument("--block-size", type=int, default=None, help="vLLM's KV block size (default: vLLM's)")
    parser.add_argument("--parts", nargs="*", default=[])
    parser.add_argument("--turns", type=Path, default=None, help="take turns with the other vLLM step (see above)")
    args = parser.parse_args()
    options = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
               if k not in ("step", "export", "parts", "out", "turns") and v not in ([], None)]
    options += ["--turns TURNS"] if args.turns else []  # the interleaving belongs to the command
    command = " ".join(["python -m benchmarks.speed.serving", args.step, *options, "--export EXPORT"])
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    result = {"vllm": run_vllm, "skiptrain": run_skiptrain, "join": join}[args.step](args)
    if args.step != "join":
        result |= {"command": command, "machine": describe()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.step == "join":
        print(json.dumps({c: {k: v for k, v in row.items() if k not in ("passes", "vllm_skip_vs_dense")}
                          for c, row in result["concurrency"].items()}, indent=1))


if __name__ == "__main__":
    main()
