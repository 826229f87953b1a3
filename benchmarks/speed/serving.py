"""Serving speed of an export in vLLM under its schedule (the skiptrain plugin) vs vLLM dense, and skiptrain's decoder.

The same E2E test prompts (the export's recorded prompt format), ``--new-tokens`` greedy tokens each (no
end-of-sequence stop), submitted ``c`` at a time for each concurrency ``c``: tokens/s over the whole ``generate``
call (prefill included). Each engine runs in a process of its own, one after the other (vLLM needs its own venv:
docs/serving.md), and a last step joins the parts with the parameter-read limit of the schedule
(:func:`skiptrain.core.speedup.parameter_read_speedup`):

    python -m benchmarks.speed.serving vllm --export EXPORT --mode skip --out skip.json        # the vLLM venv
    python -m benchmarks.speed.serving vllm --export EXPORT --mode dense --out dense.json      # the vLLM venv
    python -m benchmarks.speed.serving skiptrain --export EXPORT --out own.json                # the tested venv
    python -m benchmarks.speed.serving join --export EXPORT --parts skip.json dense.json own.json \\
        --out benchmarks/results/vllm/smollm2_e2e_flat2x.json                                # the tested venv

Each concurrency is timed ``--passes`` times after one warm-up call; the fastest pass counts. On a shared machine
run the two vLLM steps at once with ``--turns DIR`` (the same folder for both, ``skip`` started first): both engines
stay up, but only one works at a time, and they take turns pass by pass (engine start, then each concurrency of
each pass), so drift in the machine's speed hits both alike. Engines run in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): on a busy core a step can outlast vLLM's RPC timeout.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

from benchmarks.common.machine import cpu_model

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


def machine() -> dict:
    """The CPU, and the cores and threads this process may use."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


class Turns:
    """Two processes taking turns through a file in ``folder`` (``None``: no partner, every turn is ours)."""

    def __init__(self, folder: Path | None, mine: str, other: str) -> None:
        self.file, self.mine, self.other = (folder / "turn" if folder else None), mine, other
        if self.file is not None and mine == "skip":
            self.file.write_text(mine)

    def __enter__(self) -> None:
        while self.file is not None and (not self.file.is_file() or self.file.read_text() != self.mine):
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.write_text(self.other)


def run_vllm(args: argparse.Namespace) -> dict:
    """Tokens/s of one vLLM engine (``--mode skip``: the plugin's class; ``dense``: vLLM's own) per concurrency."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    import vllm
    from vllm import LLM, SamplingParams, TokensPrompt

    from skiptrain.serving.vllm_plugin import hf_overrides

    turn = Turns(args.turns, args.mode, "dense" if args.mode == "skip" else "skip")
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids(args.export, max(args.concurrency))]
    greedy = {"temperature": 0.0, "ignore_eos": True}
    with turn:
        started = time.perf_counter()
        llm = LLM(model=str(args.export), dtype=args.dtype, enforce_eager=True, enable_prefix_caching=False,
                  max_model_len=512, kv_cache_memory_bytes=256 << 20, seed=0,
                  **({"hf_overrides": hf_overrides(args.export)} if args.mode == "skip" else {}))
        startup = time.perf_counter() - started
        llm.generate(prompts[:8], SamplingParams(max_tokens=16, **greedy), use_tqdm=False)  # warm-up
    seconds: dict[int, list[float]] = {c: [] for c in args.concurrency}
    outputs = {}
    for _ in range(args.passes):
        for concurrency in args.concurrency:
            with turn:
                start = time.perf_counter()
                done = llm.generate(prompts[:concurrency], SamplingParams(max_tokens=args.new_tokens, **greedy),
                                    use_tqdm=False)
                seconds[concurrency].append(time.perf_counter() - start)
            assert all(len(out.outputs[0].token_ids) == args.new_tokens for out in done)
            outputs[str(concurrency)] = [list(out.outputs[0].token_ids) for out in done]
            print(f"vllm {args.mode} c={concurrency}: {seconds[concurrency][-1]:.2f} s", flush=True)
    rows = {str(c): {"tokens_per_s": c * args.new_tokens / min(times), "seconds": times}
            for c, times in seconds.items()}
    return {"frontend": f"vllm_{args.mode}", "vllm": vllm.__version__, "torch": torch.__version__,
            "engine_start_seconds": startup, "concurrency": rows, "token_ids": outputs}


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

    decode(collate_prompts(ids[:8], tokenizer.pad_token_id), schedule, 16)  # warm-up
    rows, outputs = {}, {}
    for concurrency in args.concurrency:
        batch = collate_prompts(ids[:concurrency], tokenizer.pad_token_id)
        row = {}
        for name, chosen in (("skip", schedule), ("dense", dense)):
            seconds = []
            for _ in range(args.passes):
                start = time.perf_counter()
                tokens = decode(batch, chosen, args.new_tokens)
                seconds.append(time.perf_counter() - start)
                print(f"skiptrain {name} c={concurrency}: {seconds[-1]:.2f} s", flush=True)
            row[f"{name}_tokens_per_s"] = concurrency * args.new_tokens / min(seconds)
            row[f"{name}_seconds"] = seconds
            if name == "skip":
                outputs[str(concurrency)] = tokens.tolist()
        rows[str(concurrency)] = row
    return {"frontend": "skiptrain", "torch": torch.__version__, "concurrency": rows, "token_ids": outputs}


def join(args: argparse.Namespace) -> dict:
    """The result file: every part, speedups and the schedule's parameter-read limit."""
    from skiptrain.core.speedup import parameter_read_speedup
    from skiptrain.export.load import load_exported
    from skiptrain.frontends.speed import parameter_counts

    model, schedule, _ = load_exported(args.export)
    parts = {part["frontend"]: part for part in (json.loads(Path(p).read_text()) for p in args.parts)}
    skip, dense, own = parts["vllm_skip"], parts["vllm_dense"], parts.get("skiptrain")
    result = {
        "commands": [part["command"] for part in parts.values()],
        "machine": parts["vllm_skip"]["machine"],
        "export": {"name": args.export.name, "base_model": "SmolLM2-135M-Instruct", "schedule": schedule.family,
                   "layers_per_generated_token": schedule.mean_layers_per_token(args.new_tokens),
                   "num_layers": schedule.num_layers},
        "dtype": args.dtype, "new_tokens": args.new_tokens, "prompts": f"E2E test sources ({PROMPTS_CSV})",
        "timing": "fastest of the passes, after one warm-up call; tokens/s over the whole generate call",
        "vllm": skip["vllm"], "torch": skip["torch"],
        "engine_start_seconds": {"skip": skip["engine_start_seconds"], "dense": dense["engine_start_seconds"]},
        "concurrency": {},
    }
    for concurrency, row in skip["concurrency"].items():
        c = int(concurrency)
        limit = parameter_read_speedup(schedule, [args.new_tokens] * c, *parameter_counts(model))
        entry = {
            "vllm_skip_tokens_per_s": row["tokens_per_s"],
            "vllm_dense_tokens_per_s": dense["concurrency"][concurrency]["tokens_per_s"],
            "parameter_read_limit": limit,
        }
        entry["vllm_skip_speedup"] = entry["vllm_skip_tokens_per_s"] / entry["vllm_dense_tokens_per_s"]
        entry["vllm_skip_fraction_of_limit"] = entry["vllm_skip_speedup"] / limit
        if own is not None:
            mine = own["concurrency"][concurrency]
            agree = [a == b for x, y in zip(skip["token_ids"][concurrency], own["token_ids"][concurrency], strict=True)
                     for a, b in zip(x, y, strict=True)]
            entry |= {"skiptrain_skip_tokens_per_s": mine["skip_tokens_per_s"],
                      "skiptrain_dense_tokens_per_s": mine["dense_tokens_per_s"],
                      "skiptrain_skip_speedup": mine["skip_tokens_per_s"] / mine["dense_tokens_per_s"],
                      "vllm_skip_vs_skiptrain_skip": entry["vllm_skip_tokens_per_s"] / mine["skip_tokens_per_s"],
                      "vllm_skip_token_agreement_with_skiptrain": sum(agree) / len(agree)}
        entry["seconds"] = {"vllm_skip": row["seconds"], "vllm_dense": dense["concurrency"][concurrency]["seconds"]}
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
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--parts", nargs="*", default=[])
    parser.add_argument("--turns", type=Path, default=None, help="take turns with the other vLLM step (see above)")
    args = parser.parse_args()
    options = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
               if k not in ("step", "export", "parts", "out", "turns") and v not in ([], None)]
    command = " ".join(["python -m benchmarks.speed.serving", args.step, *options, "--export EXPORT"])
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    result = {"vllm": run_vllm, "skiptrain": run_skiptrain, "join": join}[args.step](args)
    if args.step != "join":
        result |= {"command": command, "machine": machine()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.step == "join":
        print(json.dumps({c: {k: v for k, v in row.items() if k != "seconds"}
                          for c, row in result["concurrency"].items()}, indent=1))


if __name__ == "__main__":
    main()
