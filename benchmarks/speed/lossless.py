"""Lossless mode evidence on E2E: exactness, acceptance and speed of speculative decoding against full depth.

    python -m benchmarks.speed.lossless exactness --checkpoint CKPT --draft-schedule S.yaml --batch 8 --draft-tokens 4 \
        --out benchmarks/results/e2e/lossless/NAME.json
    OMP_NUM_THREADS=1 taskset -c 0 python -m benchmarks.speed.lossless timing --checkpoint CKPT \
        --draft-schedule S.yaml --batch 1 8 --mrs 16 --draft-tokens 2 4 6 --out ...
    python -m benchmarks.speed.lossless timing --draft-schedule benchmarks/quality/schedules/flat2x.yaml --batch 1 2 \
        --mrs 2 --new-tokens 4 --rounds 1 --out runs/lossless_smoke.json  # a smoke run of the base model
    OMP_NUM_THREADS=1 taskset -c 0 python -m benchmarks.speed.lossless timing --checkpoint CKPT \
        --draft-schedule S.yaml --batch 1 8 --mrs 16 --draft-tokens 2 4 6 --frontend both --out ...

``exactness`` decodes the MRs of ``--data`` greedily at full depth (``generate`` with every layer) and with
speculative decoding at the same batch size, and counts the outputs that differ; a difference is a near-tie when
the full-depth top-2 logits at its first differing token are closer than 1e-4. It also reports the acceptance, the
tokens per verification and the draft's measured cost ``c`` (a draft step's wall time over a full-depth step's). It
makes no speed claim: the full-depth decode there also collects logits.

``timing`` runs the arms full depth, speculative with each ``--draft-tokens`` K, and the plain skip schedule
(``--draft-schedule`` without verification, what the lossy mode costs) over the first ``--mrs`` MRs in the timing
protocol's rotated rounds (:mod:`benchmarks.common.timing`: median pair ratio over full depth, with its spread, in
wall and CPU time, every pass kept). Every arm does the same work: full depth and speculative decoding stop at
end of sequence (their outputs are equal, so are their lengths), and the plain schedule decodes each batch for as
many steps as full depth took there, without stopping (its outputs differ, its step count does not). The work
fingerprint is each batch's step count; speculative outputs that differ from full depth's are counted. No arm
collects anything the others do not. ``--batch`` takes several sizes: one row each.

``--frontend transformers`` runs instead the same through plain transformers, and ``--frontend both`` runs both
sets of arms in the same rounds: ``hf_full_depth`` (transformers' own ``model.generate``, greedy, every layer) and
``hf_speculative_kK`` (``generate(..., speculative_tokens=K)`` through an export's ``custom_generate/`` code under
the draft schedule, loaded by transformers as ``generate(custom_generate=...)`` loads it:
:func:`benchmarks.common.custom_generate.export_generate`). Each ``hf_speculative_kK`` is compared against
``hf_full_depth``, and its outputs that differ from ``hf_full_depth``'s are counted; the work fingerprint is each
batch's generated length (both stop at end of sequence). The results are the batch row's ``"transformers"``; they
have no acceptance (the export's ``generate`` returns the sequences only, as transformers' does), and
``full_depth_differing_from_skiptrain`` counts the outputs of ``hf_full_depth`` that differ from skiptrain's full
depth.

``--draft-vocab FILE`` (a JSON list of token ids: the draft's pruned LM head) and ``--draft-confidence X`` (adaptive
draft length) are passed to :func:`~skiptrain.frontends.speculative.generate_lossless` only when given, and to the
export's ``generate`` (as ``draft_vocab`` and ``draft_confidence``; without ``--draft-vocab``, ``draft_vocab=False``:
the whole vocabulary, as skiptrain's arms).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.common.custom_generate import export_generate
from benchmarks.common.machine import describe
from benchmarks.common.study import load_model, study_config, test_prompts
from benchmarks.common.timing import median_wall, run
from skiptrain import Dense, generate_under_schedule
from skiptrain.frontends.prompts import prompt_batches
from skiptrain.frontends.speculative import generate_lossless
from skiptrain.shipped.speculate import SpeculationStats, speedup_bound

TRAIN_BASE = "benchmarks/quality/e2e/train_base.yaml"
TEST_FILE = "../shared/data/e2e/subsets/testset_w_refs_100mr.csv"

NEAR_TIE = 1e-4


class Decoding:
    """One model's decoding of a list of prompt batches: full depth, speculative, or under a plain schedule."""

    def __init__(self, model, batches, new_tokens, eos, pad, levers: dict) -> None:
        self.model, self.batches, self.new_tokens, self.eos, self.pad = model, batches, new_tokens, eos, pad
        self.levers = levers  # extra generate_lossless arguments (draft_vocab, draft_confidence)

    def plain(self, schedule, logits=False, columns=None) -> dict:
        """Outputs (token lists) and each batch's step count under ``schedule``; ``columns`` (one per batch):
        decode that many steps without stopping at end of sequence; ``logits``: also the top-2 logit gaps."""
        outputs, steps, gaps = [], [], []
        for index, batch in enumerate(self.batches):
            out = generate_under_schedule(
                self.model, batch["prompt_input_ids"], batch["prompt_attention_mask"], schedule,
                self.new_tokens if columns is None else columns[index],
                eos_token_id=self.eos if columns is None else None, pad_token_id=self.pad, return_logits=logits)
            if logits:
                top2 = out.logits.topk(2, dim=-1).values
                gaps += list(top2[..., 0] - top2[..., 1])  # [G] per row
            outputs += [row[:n] for row, n in zip(out.tokens.tolist(), out.lengths.tolist(), strict=True)]
            steps.append(int(out.lengths.max()))
        return {"outputs": outputs, "steps": steps, "gaps": gaps}

    def speculative(self, draft, draft_tokens: int, levers: bool = True) -> dict:
        """As :meth:`plain` for speculative decoding, with its counts and seconds per kind of step."""
        outputs, steps, stats = [], [], SpeculationStats()
        seconds = {"prefill": 0.0, "draft": 0.0, "verify": 0.0}
        for batch in self.batches:
            out = generate_lossless(self.model, batch["prompt_input_ids"], batch["prompt_attention_mask"], draft,
                                    self.new_tokens, draft_tokens, eos_token_id=self.eos, pad_token_id=self.pad,
                                    **(self.levers if levers else {}))
            stats = stats.add(out.stats)
            for name in seconds:
                seconds[name] += getattr(out.seconds, name)
            outputs += [row[:n] for row, n in zip(out.tokens.tolist(), out.lengths.tolist(), strict=True)]
            steps.append(int(out.lengths.max()))
        return {"outputs": outputs, "steps": steps, "stats": stats, "seconds": seconds}

    def dense_step_seconds(self, dense) -> float:
        """One full-depth step's wall time: speculative decoding with no drafts, every verification one column."""
        probe = Decoding(self.model, self.batches[:1], 16, None, self.pad, {}).speculative(dense, 0, levers=False)
        return probe["seconds"]["verify"] / probe["stats"].verifications


class TransformersDecoding:
    """A :class:`Decoding`'s batches through transformers: ``model.generate`` (greedy, every layer) and the export's
    ``custom_generate`` with ``speculative_tokens=K`` under the draft schedule, with the same draft levers."""

    def __init__(self, decoding: Decoding, draft) -> None:
        self.decoding = decoding
        self.export_generate = export_generate(decoding.model, draft)
        self.levers = {"draft_vocab": False, **decoding.levers}  # False: the whole vocabulary, not a recorded one

    def full_depth(self) -> dict:
        """Outputs (token lists, up to their end of sequence) and each batch's generated length."""
        return self._decode(self.decoding.model.generate, {})

    def speculative(self, draft_tokens: int) -> dict:
        """As :meth:`full_depth`, drafted ``draft_tokens`` tokens per verification."""
        return self._decode(self.export_generate, {"model": self.decoding.model, "speculative_tokens": draft_tokens,
                                                   **self.levers})

    def _decode(self, generate, options: dict) -> dict:
        own, outputs, lengths = self.decoding, [], []
        for batch in own.batches:
            prompt = batch["prompt_input_ids"]
            generated = generate(input_ids=prompt, attention_mask=batch["prompt_attention_mask"], do_sample=False,
                                 max_new_tokens=own.new_tokens, eos_token_id=own.eos, pad_token_id=own.pad,
                                 **options)[:, prompt.shape[1]:]
            outputs += [until_end(row, own.eos) for row in generated.tolist()]
            lengths.append(generated.shape[1])
        return {"outputs": outputs, "steps": lengths}


def until_end(tokens: list[int], eos: int | None) -> list[int]:
    """``tokens`` up to their first end-of-sequence token, included (the padding after it dropped)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def speculation_summary(runs: list[dict], draft_tokens: int, dense_step_s: float) -> dict:
    """Acceptance, tokens per verification, the draft's and verification's cost per full-depth step, and the bound
    S, over the speculative ``runs`` together."""
    stats, seconds = SpeculationStats(), {"draft": 0.0, "verify": 0.0}
    for one in runs:
        stats = stats.add(one["stats"])
        seconds = {name: spent + one["seconds"][name] for name, spent in seconds.items()}
    c = seconds["draft"] / stats.draft_steps / dense_step_s if stats.draft_steps else 0.0
    v = seconds["verify"] / stats.verifications / dense_step_s
    return {
        "draft_tokens": draft_tokens,
        "acceptance": stats.acceptance_rate,
        "accepted": stats.accepted, "judged": stats.judged,
        "tokens_per_verification": stats.tokens_per_verification,
        "draft_cost_c": c,
        "verify_cost": v,
        "bound": speedup_bound(stats.acceptance_rate, draft_tokens, c, v),
    }


def differing(outputs: list[list[int]], reference: list[list[int]]) -> list[tuple[int, int]]:
    """``(row, first differing index)`` of each output that differs from its reference."""
    rows = []
    for row, (mine, theirs) in enumerate(zip(outputs, reference, strict=True)):
        if mine != theirs:
            rows.append((row, next((g for g, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                                   min(len(mine), len(theirs)))))
    return rows


def exactness(decoding: Decoding, draft, dense, draft_tokens: list[int]) -> dict:
    """Differing outputs (and near-ties among them), acceptance and costs per K; no speed claim."""
    reference = decoding.plain(dense, logits=True)
    step = decoding.dense_step_seconds(dense)
    rows = []
    for k in draft_tokens:
        drafted = decoding.speculative(draft, k)
        differ = differing(drafted["outputs"], reference["outputs"])
        near_ties = sum(first < len(reference["gaps"][row]) and bool(reference["gaps"][row][first] < NEAR_TIE)
                        for row, first in differ)
        rows.append({**speculation_summary([drafted], k, step), "differing_outputs": len(differ),
                     "differing_at_near_ties": near_ties})
    return {"tokens": sum(map(len, reference["outputs"])), "speculative": rows}


def timing(decoding: Decoding, draft, dense, draft_tokens: list[int], rounds: int, warmup: int, label: str,
           frontend: str = "skiptrain") -> dict:
    """The arms of ``frontend`` (see above) in the protocol's rounds, all of them in the same rounds."""
    reference = decoding.plain(dense)
    kept: dict[str, list[dict]] = {}

    def arm(name: str, decode):
        def one_pass() -> list[int]:
            done = decode()
            kept.setdefault(name, []).append(done)
            return done["steps"]  # the work: each batch's step count (transformers: its generated length)
        return one_pass

    arms, comparisons = {}, {}
    if frontend in ("skiptrain", "both"):
        arms["full_depth"] = arm("full_depth", lambda: decoding.plain(dense))
        arms |= {f"speculative_k{k}": arm(f"speculative_k{k}", lambda k=k: decoding.speculative(draft, k))
                 for k in draft_tokens}
        arms["skip_schedule"] = arm("skip_schedule", lambda: decoding.plain(draft, columns=reference["steps"]))
        comparisons |= {name: ("full_depth", name) for name in arms if name != "full_depth"}
    if frontend in ("transformers", "both"):
        hf = TransformersDecoding(decoding, draft)
        arms["hf_full_depth"] = arm("hf_full_depth", hf.full_depth)
        for k in draft_tokens:
            arms[f"hf_speculative_k{k}"] = arm(f"hf_speculative_k{k}", lambda k=k: hf.speculative(k))
            comparisons[f"hf_speculative_k{k}"] = ("hf_full_depth", f"hf_speculative_k{k}")
    timed = run(arms, rounds, warmup, label=label)
    kept = {name: passes[-rounds:] for name, passes in kept.items()}  # the timed passes only
    report = timed.report(comparisons)
    tokens = sum(map(len, reference["outputs"]))

    def speed(name: str, tokens: int) -> dict:
        comparison = report["comparisons"][name]
        if "refused" in comparison:
            return {"speedup": None, "claim_wall": "refused", "claim_cpu": "refused"}
        cpu = comparison["cpu"]
        return {"tokens_per_s": tokens / median_wall(timed.passes[name]), "speedup": comparison["wall"]["median"],
                "speedup_cpu": cpu["median"] if cpu else None,
                "claim_wall": comparison["claim_wall"], "claim_cpu": comparison["claim_cpu"]}

    def differing_outputs(name: str, outputs: list[list[int]]) -> int:
        return max(len(differing(p["outputs"], outputs)) for p in kept[name])

    row: dict = {"tokens": tokens, "steps_per_batch": reference["steps"]}
    if "full_depth" in arms:
        step = decoding.dense_step_seconds(dense)
        speculative = []
        for k in draft_tokens:
            name = f"speculative_k{k}"
            one = {**speculation_summary(kept[name], k, step), **speed(name, tokens),
                   "differing_outputs": differing_outputs(name, reference["outputs"])}
            one["speedup_over_bound"] = one["speedup"] / one["bound"] if one["speedup"] else None
            speculative.append(one)
        row |= {"full_depth_tokens_per_s": tokens / median_wall(timed.passes["full_depth"]),
                "speculative": speculative, "skip_schedule": speed("skip_schedule", tokens)}
    if "hf_full_depth" in arms:
        hf_reference = kept["hf_full_depth"][0]
        hf_tokens = sum(map(len, hf_reference["outputs"]))
        row["transformers"] = {
            "tokens": hf_tokens, "generated_length_per_batch": hf_reference["steps"],
            "full_depth_tokens_per_s": hf_tokens / median_wall(timed.passes["hf_full_depth"]),
            "full_depth_differing_from_skiptrain": differing_outputs("hf_full_depth", reference["outputs"]),
            "speculative": [{"draft_tokens": k, **speed(f"hf_speculative_k{k}", hf_tokens),
                             "differing_outputs": differing_outputs(f"hf_speculative_k{k}", hf_reference["outputs"])}
                            for k in draft_tokens]}
    return row | {"timing": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["exactness", "timing"])
    parser.add_argument("--checkpoint", default=None, help="a fit run's last.ckpt (default: the base model)")
    parser.add_argument("--config", default=TRAIN_BASE, help="the study's training config (model, prompt format)")
    parser.add_argument("--draft-schedule", type=Path, required=True, help="a config fragment with model.schedule")
    parser.add_argument("--data", default=TEST_FILE)
    parser.add_argument("--batch", type=int, nargs="+", default=[8], help="batch sizes: one row each")
    parser.add_argument("--mrs", type=int, default=None, help="first N MRs only")
    parser.add_argument("--draft-tokens", type=int, nargs="+", default=[4])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="timing: timed interleaved rounds (pairs)")
    parser.add_argument("--warmup", type=int, default=1, help="timing: untimed rounds first")
    parser.add_argument("--draft-vocab", type=Path, default=None, help="JSON list of the draft head's token ids")
    parser.add_argument("--draft-confidence", type=float, default=None, help="stop a row's draft below this")
    parser.add_argument("--frontend", choices=["skiptrain", "transformers", "both"], default="skiptrain",
                        help="timing: skiptrain's arms, transformers' (generate, custom_generate) or both")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.mode == "exactness" and args.frontend != "skiptrain":
        parser.error(f"--frontend {args.frontend} is invalid with exactness: allowed skiptrain (the default)")
    if args.frontend != "skiptrain" and min(args.draft_tokens) < 1:  # K = 0 there is the lossy schedule's generate
        parser.error(f"--draft-tokens {min(args.draft_tokens)} is invalid with --frontend {args.frontend}: "
                     "allowed K >= 1")
    torch.set_num_threads(args.threads)

    cli = study_config([args.config, str(args.draft_schedule)], args.data)
    model = load_model(cli, args.checkpoint)
    tokenizer = cli.datamodule.tokenizer
    num_layers = model.config.num_hidden_layers
    draft = cli.model.schedule_family.build(num_layers)
    dense = Dense().build(num_layers)
    prompts = test_prompts(cli)[1][: args.mrs]
    levers, recorded = {}, {}
    if args.draft_vocab is not None:
        ids = json.loads(args.draft_vocab.read_text())
        levers["draft_vocab"] = torch.tensor(ids)
        recorded["draft_vocab"] = {"file": str(args.draft_vocab), "size": len(ids)}
    if args.draft_confidence is not None:
        levers["draft_confidence"] = recorded["draft_confidence"] = args.draft_confidence
    result = {
        "command": "python -m benchmarks.speed.lossless " + " ".join(sys.argv[1:]),
        "machine": describe(),
        "precision": "fp32", "threads": args.threads, "checkpoint": args.checkpoint or "base (no fine-tuning)",
        "draft_schedule": {"file": str(args.draft_schedule), "family": draft.family, "params": draft.params,
                           "mean_layers_per_token": draft.mean_layers_per_token()},
        "levers": recorded, "frontend": args.frontend, "data": args.data, "mrs": len(prompts),
        "new_tokens": args.new_tokens, "batches": {},
    }
    for batch in args.batch:
        batches = list(prompt_batches(tokenizer, prompts, batch))
        decoding = Decoding(model, batches, args.new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id, levers)
        if args.mode == "exactness":
            row = exactness(decoding, draft, dense, args.draft_tokens)
        else:
            row = timing(decoding, draft, dense, args.draft_tokens, args.rounds, args.warmup, f"batch {batch} ",
                         args.frontend)
        result["batches"][str(batch)] = row
        print(f"batch {batch}", json.dumps({k: v for k, v in row.items() if k != "timing"}, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
