"""A skip row's share of its dense ceiling on one split, with a paired bootstrap interval over the split's articles.

    python -m benchmarks.quality.paired cnndm --skip flat2x+lora_all_r64 --dense dense+lora_all_r64 --split dev
    python -m benchmarks.quality.paired cnndm --skip flat2x+lora_all_r64 flat2x+lora_all_r64_s1 \
        --dense dense+lora_all_r64 dense+lora_all_r64_s1 --split test

The rows' outputs (``NAME.SPLIT.outputs.jsonl``, written by ``score.py``) are scored article by article against the
split's references (ROUGE-L F by default, ``--metric rouge_1`` or ``rouge_2``), as ``score.py``'s scores average
them, and averaged over the rows of each side (its seeds); the share is the ratio of the two sides' means. Its
interval is the 2.5th to 97.5th percentile of that ratio over ``--resamples`` seeded resamplings of the articles, the
same resampled articles for both sides. The dev splits hold 40 articles, on which one ROUGE-L point moves a share by
about 4%: this says how far a comparison can be trusted given the articles. The spread between training seeds is in
it only as far as each side averages several seeds.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import datasets
import torch
from torchmetrics.functional.text.rouge import rouge_score

from benchmarks.quality import study_report
from benchmarks.quality.headline import split_references

METRICS = {"rouge_l": "rougeL", "rouge_1": "rouge1", "rouge_2": "rouge2"}
SPLITS = ("dev", "test")


@dataclass(frozen=True)
class PairedShare:
    articles: int
    skip: float  # the skip side's mean score
    dense: float
    share: float  # skip / dense
    low: float  # the share's bootstrap percentiles
    high: float
    better: int  # articles where the skip side scores higher, equal, lower
    equal: int
    worse: int


def article_scores(predictions: list[str], references: list[list[str]], metric: str = "rouge_l") -> torch.Tensor:
    """Each prediction's F-measure against its references (the best of them), the terms ``score.py``'s corpus
    score averages."""
    key = METRICS[metric]
    return torch.tensor([rouge_score([p], [r], rouge_keys=key)[f"{key}_fmeasure"].item()
                         for p, r in zip(predictions, references, strict=True)])


def paired_share(skip: torch.Tensor, dense: torch.Tensor, resamples: int = 10_000, seed: int = 0) -> PairedShare:
    """The share ``skip.mean() / dense.mean()`` of paired per-article scores and its 95% bootstrap interval."""
    if skip.shape != dense.shape or skip.dim() != 1 or len(skip) == 0:
        raise ValueError(f"paired scores must be two equal, non-empty vectors, not {tuple(skip.shape)} and "
                         f"{tuple(dense.shape)}")
    rows = torch.randint(len(skip), (resamples, len(skip)), generator=torch.Generator().manual_seed(seed))
    shares = skip[rows].mean(1) / dense[rows].mean(1)
    low, high = torch.quantile(shares.double(), torch.tensor([0.025, 0.975], dtype=torch.double)).tolist()
    return PairedShare(articles=len(skip), skip=skip.mean().item(), dense=dense.mean().item(),
                       share=(skip.mean() / dense.mean()).item(), low=low, high=high,
                       better=int((skip > dense).sum()), equal=int((skip == dense).sum()),
                       worse=int((skip < dense).sum()))


def predictions_of(study: str, name: str, split: str) -> list[str]:
    path = study_report.RESULTS / study / "study" / f"{name}.{split}.outputs.jsonl"
    if not path.is_file():
        raise SystemExit(f"{study}: row {name!r} has no {split} outputs: {path} is missing (score it with "
                         f"benchmarks/quality/study.sh)")
    return [json.loads(line)["prediction"] for line in path.read_text().splitlines()]


def side_scores(study: str, names: list[str], split: str, references: list[list[str]], metric: str) -> torch.Tensor:
    """Per-article scores of a side: each article's mean over the side's rows (seeds)."""
    scores = []
    for name in names:
        predictions = predictions_of(study, name, split)
        if len(predictions) != len(references):
            raise SystemExit(f"{study}: row {name!r} has {len(predictions)} {split} outputs for the split's "
                             f"{len(references)} rows")
        scores.append(article_scores(predictions, references, metric))
    return torch.stack(scores).mean(0)


def compare(study: str, skip: list[str], dense: list[str], split: str = "dev", metric: str = "rouge_l",
            resamples: int = 10_000) -> PairedShare:
    """The paired share of the ``skip`` rows over the ``dense`` rows on one split of a study."""
    references = split_references(study, split)
    return paired_share(side_scores(study, skip, split, references, metric),
                        side_scores(study, dense, split, references, metric), resamples=resamples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="a study of benchmarks/quality/STUDY/study.env, e.g. cnndm or xsum")
    parser.add_argument("--skip", nargs="+", required=True, metavar="NAME",
                        help="the skip side's scored rows (NAME[_sN][@DECODE]): its seeds, averaged per article")
    parser.add_argument("--dense", nargs="+", required=True, metavar="NAME", help="the dense ceiling's rows")
    parser.add_argument("--split", choices=SPLITS, default="dev")
    parser.add_argument("--metric", choices=sorted(METRICS), default="rouge_l")
    parser.add_argument("--resamples", type=int, default=10_000)
    args = parser.parse_args(argv)
    if not (study_report.STUDIES / args.study / "study.env").is_file():
        parser.error(f"study {args.study!r} has no {study_report.STUDIES / args.study / 'study.env'}")
    datasets.disable_progress_bars()
    result = compare(args.study, args.skip, args.dense, args.split, args.metric, args.resamples)
    print(f"{args.study} {args.split}, {result.articles} articles, {args.metric}: {' '.join(args.skip)} "
          f"{100 * result.skip:.1f} against {' '.join(args.dense)} {100 * result.dense:.1f}: share "
          f"{100 * result.share:.1f}% "
          f"(95% paired bootstrap over articles: {100 * result.low:.1f}-{100 * result.high:.1f}%); the skip side "
          f"scores higher on {result.better}, the same on {result.equal}, lower on {result.worse}")


if __name__ == "__main__":
    main()
