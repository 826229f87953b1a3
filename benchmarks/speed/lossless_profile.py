"""Where a lossless speculative round spends its time: a breakdown, not a speed claim.

    OMP_NUM_THREADS=1 taskset -c 0 nice -n 10 python -m benchmarks.speed.lossless_profile \
        --out benchmarks/results/e2e/lossless/profile.json

For each ``--batch`` size the first MRs of the E2E test split are prefilled and decoded ``--context`` columns at
full depth into :class:`~skiptrain.frontends.speculative.SkipSteps`' cache. On that cache three calls are timed in
interleaved rounds (full, draft, verification, full, ...; the cache cut back before each, untimed): a full-depth step
(one column), a draft step (one column, the draft's layers) and a verification (``K + 1`` columns, every layer).
Their ratios to the full step are ``c`` and ``v`` of the cost model (benchmarks/results/e2e/lossless/cost_model.md).
Each call is split by module clocks into its decoder layers, the LM head, the cache cut and the rest (embedding,
masks, rotary inputs, final norm, Python), and the LM head alone is timed over 1 to ``B (K + 1)`` hidden states
(what a head run on fewer columns, or one column at a time, costs). The verification is timed again after
``--padding`` padding columns (rejected columns, as a decode leaves them) have grown the cache. The share of the
verification's layers that recompute what the draft already computed exactly (its layers before the first one it
skips, for the ``K`` columns the draft ran) is read from the per-layer clocks.

Last, one greedy speculative decode of ``--new-tokens`` tokens per row splits its thread time into prefill, draft
steps, verifications, the cache's compaction after each verification and the loop's own per-row bookkeeping, and
counts what the batch pays for: row-columns verified against tokens kept (a verified column a row does not keep
stays in its cache as padding), and rows per verification (a row that ends leaves the batch).

Times are the thread's CPU time (``time.thread_time``; run with one torch thread): on a shared machine wall time
also counts the time other jobs hold the core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from skiptrain.core.schedules import SkipSchedule
from skiptrain.frontends.speculative import SkipSteps
from skiptrain.shipped import speculate as speculate_module
from skiptrain.shipped.cache import compact_cache
from skiptrain.shipped.speculate import crop_cache, speculate

TRAIN_BASE = "benchmarks/quality/e2e/train_base.yaml"
TEST_FILE = "../shared/data/e2e/subsets/testset_w_refs_100mr.csv"
DRAFT = "benchmarks/quality/schedules/flat2x.yaml"
CLOCK = time.thread_time


class Clocks:
    """Thread seconds per section while installed: forward hooks on each decoder layer and the LM head, a wrapper
    on the cache cut. ``layers[i]`` is layer ``i``'s total."""

    def __init__(self, steps: SkipSteps) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.layers = [0.0] * steps.parts.num_layers
        self._handles = []
        for index, layer in enumerate(steps.parts.layers):
            self._clock(layer, lambda spent, i=index: self.layers.__setitem__(i, self.layers[i] + spent))
        self._clock(steps.parts.lm_head, lambda spent: self._add("lm head", spent))

    def _add(self, section: str, spent: float) -> None:
        self.seconds[section] += spent

    def _clock(self, module: nn.Module, record: Callable[[float], None]) -> None:
        starts: list[float] = []
        self._handles.append(module.register_forward_pre_hook(lambda *_: starts.append(CLOCK())))
        self._handles.append(module.register_forward_hook(lambda *_: record(CLOCK() - starts.pop())))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


class Profiled:
    """One batch's prefilled cache ``past`` columns long, and the three calls of a round on it."""

    def __init__(self, steps: SkipSteps, ids: torch.Tensor, mask: torch.Tensor, context: int,
                 draft_tokens: int) -> None:
        self.steps, self.draft_tokens, self.context = steps, draft_tokens, context
        token = steps.prefill(ids, mask).argmax(-1)
        self.mask, self.past = mask, ids.shape[1]
        for _ in range(context):  # full-depth decode steps: a cache as a decode holds it
            self.mask = self._grown(1)
            token = steps.verify(token[:, None], self.mask, self.past)[:, -1].argmax(-1)
            self.past += 1
        self.token = token

    def _grown(self, columns: int, value: int = 1) -> torch.Tensor:
        return torch.cat([self.mask, self.mask.new_full((len(self.mask), columns), value)], 1)

    def pad(self, columns: int) -> None:
        """Grow the cache by ``columns`` full-depth columns masked as padding, as rejected drafts leave them."""
        for _ in range(columns):
            self.steps.verify(self.token[:, None], self._grown(1), self.past)
            self.mask, self.past = self._grown(1, 0), self.past + 1

    def calls(self) -> dict[str, Callable[[], torch.Tensor]]:
        columns = torch.stack([self.token] * (self.draft_tokens + 1), 1)  # [B, K + 1]
        steps, one, verified = self.steps, self._grown(1), self._grown(self.draft_tokens + 1)
        return {"full": lambda: steps.verify(self.token[:, None], one, self.past),
                "draft": lambda: steps.draft(self.token[:, None], one, self.context),
                "verify": lambda: steps.verify(columns, verified, self.past)}

    def timed(self, call: Callable[[], torch.Tensor]) -> float:
        crop_cache(self.steps.cache, self.past)
        started = CLOCK()
        call()
        return CLOCK() - started

    def rounds(self, rounds: int) -> dict[str, dict]:
        """Median milliseconds of each call over interleaved ``rounds`` (after one warm-up), and over ``full``."""
        calls = self.calls()
        for call in calls.values():
            self.timed(call)
        seconds: dict[str, list[float]] = defaultdict(list)
        for _ in range(rounds):
            for name, call in calls.items():
                seconds[name].append(self.timed(call))
        result = {}
        for name, values in seconds.items():
            ratios = [x / f for x, f in zip(values, seconds["full"], strict=True)]
            result[name] = {"median_ms": ms(statistics.median(values)), "min_ms": ms(min(values)),
                            "over_full": round(statistics.median(ratios), 3)}
        return result

    def sections(self, rounds: int, exact_layers: int) -> dict[str, dict]:
        """Each call's mean milliseconds in its decoder layers, LM head, cache cut and the rest; for the
        verification also the layers' share that recomputes the draft's exact leading layers."""
        result = {}
        for name, call in self.calls().items():
            clocks = Clocks(self.steps)
            try:
                started = CLOCK()
                for _ in range(rounds):
                    crop_started = CLOCK()
                    crop_cache(self.steps.cache, self.past)  # the call's own cut (verification) finds nothing to cut
                    clocks.seconds["cache cut"] += CLOCK() - crop_started
                    call()
                total = CLOCK() - started
            finally:
                clocks.close()
            layers = sum(clocks.layers)
            row = {"total": total, "decoder layers": layers, **clocks.seconds}
            row["rest (embedding, masks, rotary, norm, python)"] = total - sum(v for k, v in row.items()
                                                                                if k != "total")
            if name == "verify":
                row["recomputed draft layers"] = sum(clocks.layers[:exact_layers]) * self.draft_tokens / (
                    self.draft_tokens + 1)
            result[name] = {k: ms(v / rounds) for k, v in row.items()}
        return result


def head_by_rows(steps: SkipSteps, rows: list[int], rounds: int) -> dict[str, float]:
    """Median milliseconds of the LM head (with its soft-capping) over ``n`` hidden states, for each ``n`` in
    ``rows``: what a head run on fewer columns, one column at a time, would cost."""
    size = steps.parts.lm_head.weight.shape[1]
    result = {}
    for n in rows:
        hidden = torch.randn(n, size, dtype=steps.parts.lm_head.weight.dtype)
        steps.parts.logits(hidden)  # warm-up
        seconds = []
        for _ in range(rounds):
            started = CLOCK()
            steps.parts.logits(hidden)
            seconds.append(CLOCK() - started)
        result[str(n)] = ms(statistics.median(seconds))
    return result


def ms(seconds: float) -> float:
    return round(1e3 * seconds, 3)


def exact_prefix(draft: SkipSchedule, index: int) -> int:
    """Layers ``0..e-1`` a draft runs before the first one it skips: their keys, values and outputs are full depth's."""
    layers = set(draft.executed_layers(index))
    return next((i for i in range(draft.num_layers) if i not in layers), draft.num_layers)


def decode_breakdown(model: nn.Module, draft: SkipSchedule, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int,
                     draft_tokens: int, eos: int | None, pad: int) -> dict:
    """One greedy speculative decode: its thread time by kind of call and the loop's bookkeeping, and what the
    batch paid for (row-columns verified against tokens kept, rows per verification)."""
    steps = SkipSteps(model, draft, ids.shape[1])
    clocks: dict[str, float] = defaultdict(float)
    verified_columns = []
    for kind in ("prefill", "draft", "verify"):
        call = getattr(steps, kind)

        def clocked(input_ids, *args, kind=kind, call=call):
            started = CLOCK()
            try:
                return call(input_ids, *args)
            finally:
                clocks[kind] += CLOCK() - started
                if kind == "verify":
                    verified_columns.append(input_ids.numel())

        setattr(steps, kind, clocked)

    def compact(*args):
        started = CLOCK()
        try:
            return compact_cache(*args)
        finally:
            clocks["cache compaction"] += CLOCK() - started

    speculate_module.compact_cache = compact
    started = CLOCK()
    try:
        _, lengths, stats = speculate(steps, ids, mask, new_tokens, draft_tokens, eos, pad)
    finally:
        speculate_module.compact_cache = compact_cache
    total = CLOCK() - started
    row_columns = sum(verified_columns)
    return {
        "new_tokens": new_tokens, "thread_s": round(total, 3),
        "share": {**{kind: round(spent / total, 3) for kind, spent in clocks.items()},
                  "loop bookkeeping": round(1 - sum(clocks.values()) / total, 3)},
        "acceptance": round(stats.acceptance_rate, 3), "verifications": stats.verifications,
        "draft_steps": stats.draft_steps, "tokens_per_row_verification": round(stats.tokens_per_verification, 3),
        "tokens_generated": int(lengths.sum()), "row_columns_verified": row_columns,
        # a verified column a row does not keep stays in the cache as padding: 1 - this is the cache's padding share
        "kept_per_row_column_verified": round(stats.committed / row_columns, 3),
        "rows_per_verification": round(stats.row_verifications / stats.verifications, 3),
    }


def profile_batch(model: nn.Module, draft: SkipSchedule, ids: torch.Tensor, mask: torch.Tensor, args,
                  eos: int | None, pad: int) -> dict:
    """The whole breakdown for one batch (``args``: ``draft_tokens``, ``context``, ``padding``, ``rounds``,
    ``new_tokens``)."""
    steps = SkipSteps(model, draft, ids.shape[1])
    state = Profiled(steps, ids, mask, args.context, args.draft_tokens)
    exact = exact_prefix(draft, args.context)
    row = {"prompt_columns": ids.shape[1], "cache_columns": state.past, "draft_exact_prefix_layers": exact,
           "calls": state.rounds(args.rounds), "sections_ms": state.sections(max(2, args.rounds // 2), exact)}
    state.pad(args.padding)
    columns = len(ids) * (args.draft_tokens + 1)
    row["lm_head_ms_by_rows"] = head_by_rows(steps, sorted({1, 2, 4, len(ids), columns // 2, columns}), args.rounds)
    row["padded"] = {"padding_columns": args.padding, "cache_columns": state.past,
                     "calls": state.rounds(args.rounds)}
    row["decode"] = decode_breakdown(model, draft, ids, mask, args.new_tokens, args.draft_tokens, eos, pad)
    return row


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parse.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parse.add_argument("--draft-tokens", type=int, default=4)
    parse.add_argument("--context", type=int, default=16, help="full-depth columns decoded before the timed calls")
    parse.add_argument("--padding", type=int, default=32, help="padding columns added for the padded verification")
    parse.add_argument("--rounds", type=int, default=5)
    parse.add_argument("--new-tokens", type=int, default=32)
    parse.add_argument("--checkpoint", default=None, help="a training run's checkpoint (default: the base model)")
    parse.add_argument("--draft-schedule", default=DRAFT)
    parse.add_argument("--data", default=TEST_FILE, help="the E2E test split")
    parse.add_argument("--out", type=Path, required=True)
    return parse


def main() -> None:
    from benchmarks.common.machine import describe
    from benchmarks.common.study import load_model, study_config, test_prompts
    from skiptrain.frontends.prompts import prompt_batches

    args = parser().parse_args()
    torch.set_num_threads(1)
    cli = study_config([TRAIN_BASE, args.draft_schedule], args.data)
    model = load_model(cli, args.checkpoint)
    tokenizer = cli.datamodule.tokenizer
    draft = cli.model.schedule_family.build(model.config.num_hidden_layers)
    prompts = test_prompts(cli)[1]
    result = {"command": "OMP_NUM_THREADS=1 taskset -c 0 nice -n 10 python -m benchmarks.speed.lossless_profile "
                         f"--batch {' '.join(map(str, args.batch))} --draft-tokens {args.draft_tokens} "
                         f"--context {args.context} --padding {args.padding} --rounds {args.rounds} "
                         f"--new-tokens {args.new_tokens}",
              "machine": {**describe(), "load_average_before": list(os.getloadavg())},
              "model": cli.model.model_name, "checkpoint": args.checkpoint, "precision": "fp32",
              "draft_schedule": args.draft_schedule, "data": Path(args.data).name,
              "draft_layers": len(draft.executed_layers(args.context)), "layers": model.config.num_hidden_layers,
              "draft_tokens": args.draft_tokens, "clock": "thread CPU time", "batches": {}}
    with torch.no_grad():
        for size in args.batch:
            batch = next(prompt_batches(tokenizer, prompts, size))
            row = profile_batch(model, draft, batch["prompt_input_ids"], batch["prompt_attention_mask"], args,
                                tokenizer.eos_token_id, tokenizer.pad_token_id)
            result["batches"][str(size)] = row
            print(json.dumps({size: row}, indent=1), flush=True)
    result["machine"]["load_average_after"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
