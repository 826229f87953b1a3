"""Score one row of the E2E evidence table: the quality of a model decoded under a schedule.

    python benchmarks/e2e/score.py --name row5 --checkpoint runs/e2e/skipdecode2x/.../last.ckpt \
        --decode-schedule benchmarks/e2e/schedule_skipdecode2x.yaml --out benchmarks/results/e2e/row5.json

Without ``--checkpoint`` the base model (zero-shot, prompt only) is scored. Quality: greedy decoding of the
100 test MRs (all references; ``--data`` names another E2E file, e.g. the 50-MR dev subset used to choose
settings) with end-of-sequence stopping, multi-reference SacreBLEU and ROUGE-L (torchmetrics). Cost: the mean
executed decoder layers over the tokens actually generated, and the ideal speedup that implies, next to the
schedule's nominal ideal over its own span. Decode speed depends on the schedule, not on the weights, and is
measured apart, on a quiet machine, by ``speed.py``. Every output, with its source and references, is written
beside the scores (``--out`` with ``.outputs.jsonl`` for ``.json``) for error analyses such as ``slot_errors.py``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml
from torchmetrics.text import ROUGEScore, SacreBLEUScore

import skiptrain
from skiptrain import generate
from skiptrain.core.speedup import ideal_speedup, mean_executed_layers
from skiptrain.data.datamodule import SkipDataModule
from skiptrain.modeling.loading import load_causal_lm, load_tokenizer
from skiptrain.training.warm_start import trained_model

TEST_FILE = "../shared/data/e2e/subsets/testset_w_refs_100mr.csv"
BASE_MODEL = "smollm2-135m-instruct"


def schedule_family(path: Path) -> skiptrain.ScheduleFamily:
    """The schedule family of a config fragment (``model.schedule`` with ``class_path``/``init_args``)."""
    spec = yaml.safe_load(path.read_text())["model"]["schedule"]
    family = getattr(skiptrain, spec["class_path"].rsplit(".", 1)[-1])
    return family(**spec.get("init_args", {}))


def load_model(checkpoint: str | None) -> torch.nn.Module:
    """The base model, or a run's model with LoRA merged (as in an export)."""
    return (load_causal_lm(BASE_MODEL) if checkpoint is None else trained_model(checkpoint)).eval()


def test_batches(data_file: str, batch_size: int, task: str = "e2e_nlg", max_source_tokens: int = 96) -> list[dict]:
    data = SkipDataModule(task=task, tokenizer=BASE_MODEL, data_files={"test": data_file},
                          eval_batch_size=batch_size, max_source_tokens=max_source_tokens, max_target_tokens=64)
    data.setup("test")
    return list(data.test_dataloader())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--decode-schedule", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", default=TEST_FILE, help="E2E csv with references (default: the 100 test MRs)")
    parser.add_argument("--task", default="e2e_nlg", help="skiptrain task of --data (e.g. xsum)")
    parser.add_argument("--max-source-tokens", type=int, default=96, help="source truncation, as in training")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model, tokenizer = load_model(args.checkpoint), load_tokenizer(BASE_MODEL)
    schedule = schedule_family(args.decode_schedule).build(model.config.num_hidden_layers)
    batches = test_batches(args.data, batch_size=8, task=args.task, max_source_tokens=args.max_source_tokens)

    sources, predictions, references, lengths, started = [], [], [], [], time.perf_counter()
    for batch in batches:
        out = generate(model, batch["prompt_input_ids"], batch["prompt_attention_mask"], schedule,
                       max_new_tokens=args.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
        predictions += out.texts(tokenizer)
        lengths += out.lengths.tolist()
        references += batch["references"]
        sources += batch["sources"]
    quality_seconds = time.perf_counter() - started

    bleu = SacreBLEUScore()(predictions, references).item()
    rouge = ROUGEScore(rouge_keys=("rouge1", "rouge2", "rougeL"))(predictions, references)

    mean_layers = mean_executed_layers(schedule, lengths)
    result = {
        "name": args.name,
        "checkpoint": args.checkpoint or f"{BASE_MODEL} (no fine-tuning)",
        "decode_schedule": {"family": schedule.family, "params": schedule.params},
        "data": args.data,
        "test_mrs": len(predictions),
        "bleu": bleu,
        "rouge_l": rouge["rougeL_fmeasure"].item(),
        "rouge_1": rouge["rouge1_fmeasure"].item(),
        "rouge_2": rouge["rouge2_fmeasure"].item(),
        "mean_generated_tokens": sum(lengths) / len(lengths),
        "mean_layers_per_generated_token": mean_layers,
        "ideal_speedup_over_generated_tokens": ideal_speedup(schedule, lengths),
        "nominal_ideal_speedup": schedule.ideal_speedup(),
        "nominal_span_tokens": schedule.span,
        "quality_decoding_seconds": quality_seconds,
        "threads": args.threads,
        "examples": [{"prediction": p, "references": r[:2]} for p, r in zip(predictions[:5], references[:5],
                                                                               strict=True)],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    outputs = (json.dumps({"source": s, "prediction": p, "references": r}) + "\n"
               for s, p, r in zip(sources, predictions, references, strict=True))
    args.out.with_suffix(".outputs.jsonl").write_text("".join(outputs))
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=2))


if __name__ == "__main__":
    main()
