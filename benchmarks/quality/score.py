"""Score one study configuration: the quality of a model decoded under a schedule, and what the decoding cost.

    python -m benchmarks.quality.score --name skipdecode2x --checkpoint runs/e2e/skipdecode2x/last.ckpt \
        --config benchmarks/quality/e2e/train_base.yaml --config benchmarks/quality/schedules/skipdecode2x.yaml \
        --data ../shared/data/e2e/subsets/testset_w_refs_100mr.csv --out benchmarks/results/e2e/study/x.test.json

The ``--config`` chain is read by skiptrain's own CLI parser, as ``fit`` reads it: its ``model.schedule`` is the
schedule decoded under, its data settings (task, prompt template, ``max_source_tokens``) fill the prompts of
``--data`` as training fills them. Without ``--checkpoint`` the configured base model (zero-shot) is scored.
Decoding is :func:`skiptrain.frontends.decode.complete`: greedy, or the chain's ``model.generation.sampling``
(e.g. ``benchmarks/quality/decoding/no_repeat3.yaml``: greedy that never repeats a generated trigram), batches of 8,
end-of-sequence stopping.
Quality: multi-reference SacreBLEU and ROUGE (torchmetrics). Cost: the mean executed decoder layers over the tokens
actually generated, and the ideal speedup that implies, next to the schedule's nominal ideal over its own span.
Decode speed is measured apart, on a quiet machine (``python -m benchmarks.speed.schedules``). Every output, with its
source and references, is written beside the scores (``.outputs.jsonl`` for ``.json``) for error analyses; with
``--predictions-only`` (articles: the data stays where it is) just the outputs, in the order of ``--data``'s rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from torchmetrics.text import ROUGEScore, SacreBLEUScore

from benchmarks.common.study import load_model, study_config, test_prompts
from skiptrain.core.output_dir import write_whole
from skiptrain.frontends.decode import Decoder, complete
from skiptrain.frontends.request import GenerationRequest


def quality(predictions: list[str], references: list[list[str]]) -> dict[str, float]:
    """Multi-reference SacreBLEU and ROUGE-1/2/L F-measures of ``predictions`` (one list of references each), as
    the scores record them (also re-scored from the outputs: ``benchmarks/quality/headline.py``)."""
    rouge = ROUGEScore(rouge_keys=("rouge1", "rouge2", "rougeL"))(predictions, references)
    return {"bleu": SacreBLEUScore()(predictions, references).item(), "rouge_l": rouge["rougeL_fmeasure"].item(),
            "rouge_1": rouge["rouge1_fmeasure"].item(), "rouge_2": rouge["rouge2_fmeasure"].item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--config", action="append", required=True, help="a config of the chain (repeatable)")
    parser.add_argument("--data", required=True, help="the scored split: a file with references")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--predictions-only", action="store_true",
                        help="write only the outputs to .outputs.jsonl, not the sources and references beside them")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    cli = study_config(args.config, args.data)
    model = load_model(cli, args.checkpoint)
    schedule = cli.model.schedule_family.build(model.config.num_hidden_layers)
    sources, prompts, references = test_prompts(cli)
    sampling = cli.model.generation.sampling
    completions, stats = complete(Decoder(model, cli.datamodule.tokenizer), schedule, prompts,
                                  GenerationRequest(max_new_tokens=args.max_new_tokens, sampling=sampling))
    predictions = [c.completion for c in completions]

    result = {
        "name": args.name,
        "checkpoint": args.checkpoint or f"{cli.model.model_name} (no fine-tuning)",
        "decode_schedule": {"family": schedule.family, "params": schedule.params},
        "sampling": dataclasses.asdict(sampling),
        "configs": args.config,
        "data": args.data,
        "test_mrs": len(predictions),
        **quality(predictions, references),
        "mean_generated_tokens": stats.num_tokens / len(completions),
        "mean_layers_per_generated_token": stats.mean_layers_per_token,
        "ideal_speedup_over_generated_tokens": stats.ideal_speedup,
        "nominal_ideal_speedup": schedule.sequence_ideal_speedup(),
        "nominal_span_tokens": schedule.span,
        "quality_decoding_seconds": stats.seconds,
        "threads": args.threads,
        "examples": [{"prediction": p, "references": r[:2]} for p, r in zip(predictions[:5], references[:5],
                                                                               strict=True)],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    records = ({"prediction": p} if args.predictions_only else {"source": s, "prediction": p, "references": r}
               for s, p, r in zip(sources, predictions, references, strict=True))
    # The scores last: study.sh takes their file as "this split is scored", so it must not exist before the outputs
    # do, nor half-written (a sitting that stops mid-write would otherwise leave a row that is never re-scored).
    write_whole(args.out.with_suffix(".outputs.jsonl"), "".join(json.dumps(record) + "\n" for record in records))
    write_whole(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=2))


if __name__ == "__main__":
    main()
