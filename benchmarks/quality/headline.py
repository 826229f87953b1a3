"""The summarisation headline (``benchmarks/results/summarisation_headline.json``), re-scored from the raw outputs.

    python -m benchmarks.quality.headline
    python -m benchmarks.quality.headline --set cnndm --skip flat2x+lora_all_r64 flat2x+lora_all_r64_s1 \\
        --dense dense+lora_all_r64 dense+lora_all_r64_s1

The file names, per dataset (a study of ``benchmarks/quality/STUDY/study.env``: ``cnndm``, ``xsum``), the test-split
outputs (``NAME.test.outputs.jsonl`` beside ``NAME.test.json``, written by ``score.py``: one prediction per line, in
the split's row order) of the headline skip configuration's seeds (``skip``) and of its dense ceiling's seeds
(``dense``), and the realised speedup (``speedup``: the skip seeds' mean ideal speedup over the tokens they
generated), with the precision the rows trained in and their decoding.

Without arguments every dataset is re-scored: the references of the study's ``TEST_DATA`` are read as ``score.py``
reads them (the split is written first by the study's ``PREPARE`` where it is missing), each outputs file is scored
with ``score.py``'s metrics and must equal its committed scores, and ROUGE-L per seed, the means and the skip rows'
share of the dense mean are printed. ``--set`` names a dataset's rows (seeded row names, ``NAME[_sN][@DECODE]``) and
writes the file: the rows must exist, be test-split scores of one configuration per side with at least two seeds,
share one precision and one decoding, and the dense rows must decode at full depth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import datasets

from benchmarks.common.study import study_config, test_prompts
from benchmarks.quality import study_report
from benchmarks.quality.score import quality
from benchmarks.quality.study_report import UNRECORDED, precision, seedless, study_env
from skiptrain.core.output_dir import write_whole
from skiptrain.modeling.generation import SamplingConfig

DATASETS = ("cnndm", "xsum")
HEADLINE = "summarisation_headline.json"
OUTPUTS = ".test.outputs.jsonl"
METRICS = ("rouge_l", "rouge_1", "rouge_2", "bleu")
GREEDY = dataclasses.asdict(SamplingConfig())
RESCORE_TOLERANCE = 1e-6
"""Relative: the metrics are float32, whose last bit can differ between machines (an XSum seed's BLEU by 1 ulp, 9e-8);
an output edited so that its overlap with its references changes moves ROUGE by far more (about 1e-4)."""


def headline_file() -> Path:
    return study_report.RESULTS / HEADLINE


def outputs_of(study: str, name: str) -> Path:
    return study_report.RESULTS / study / "study" / f"{name}{OUTPUTS}"


def scores_of(outputs: Path) -> Path:
    """The committed scores beside an outputs file (``NAME.test.outputs.jsonl`` -> ``NAME.test.json``)."""
    return outputs.with_name(outputs.name.removesuffix(".outputs.jsonl") + ".json")


def name_of(path: str) -> str:
    return Path(path).name.removesuffix(OUTPUTS)


def decoding(name: str, scores: dict) -> tuple[str, str]:
    """A row's decoding: the option of its name (``NAME@DECODE+OPTION``; none: greedy) and the sampling its scores
    record (scores written before they recorded it decoded greedily)."""
    option = name.partition("@")[2].partition("+")[2] or "greedy"
    return option, json.dumps(scores.get("sampling") or GREEDY, sort_keys=True)


def headline_entry(study: str, skip: list[str], dense: list[str]) -> dict:
    """A dataset's entry of the headline file, from its skip and dense rows' names, or a one-line refusal."""
    test_data = study_env(study)["TEST_DATA"]
    scores = {}
    for name in skip + dense:
        outputs = outputs_of(study, name)
        for path in (outputs, scores_of(outputs)):
            if not path.is_file():
                raise SystemExit(f"{study}: row {name!r} has no test scores: {path} is missing")
        scores[name] = json.loads(scores_of(outputs).read_text())
        if scores[name]["data"] != test_data:
            raise SystemExit(f"{study}: row {name!r} was scored on {scores[name]['data']}, not the test split "
                             f"{test_data}")
    for side, names in (("skip", skip), ("dense", dense)):
        configurations = {seedless(name) for name in names}
        if len(configurations) != 1 or len(set(names)) < 2 or len(set(names)) != len(names):
            raise SystemExit(f"--{side} {' '.join(names)}: allowed two or more distinct seeds of one configuration "
                             f"(NAME, NAME_s1, ...), not {sorted(configurations)}")
        at_full_depth = {scores[name]["decode_schedule"]["family"] == "dense" for name in names}
        if at_full_depth != {side == "dense"}:
            raise SystemExit(f"--{side} {' '.join(names)}: the dense rows must decode at full depth and the skip rows "
                             "under a skipping schedule")
    precisions = {name: precision(study, name) for name in skip + dense}
    if len(set(precisions.values())) != 1 or UNRECORDED in precisions.values():
        raise SystemExit(f"{study}: the rows trained in different or unrecorded precisions ({precisions}): a share is "
                         "only taken within one recorded precision")
    decodings = {name: decoding(name, scores[name]) for name in skip + dense}
    if len(set(decodings.values())) != 1:
        options = {name: option for name, (option, _) in decodings.items()}
        raise SystemExit(f"{study}: the rows decode differently ({options}): skip and dense must decode alike")
    speedup = sum(scores[name]["ideal_speedup_over_generated_tokens"] for name in skip) / len(skip)
    return {"skip": [str(outputs_of(study, name)) for name in skip],
            "dense": [str(outputs_of(study, name)) for name in dense],
            "speedup": round(speedup, 2), "precision": precisions[skip[0]], "decoding": decodings[skip[0]][0]}


def split_references(study: str, split: str = "test") -> list[list[str]]:
    """The references of the study's test (or dev) split, read as ``score.py`` reads them; the split is written by
    the study's ``PREPARE`` first where it is missing. A one-line refusal where its data is absent."""
    env = study_env(study)
    data = Path(env[f"{split.upper()}_DATA"])
    if not data.is_file() and env["PREPARE"]:
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # PREPARE runs `python`
        prepared = subprocess.run(["bash", "-c", env["PREPARE"]], capture_output=True, text=True,
                                  env={**os.environ, "PATH": path})
        if prepared.returncode:
            reason = (prepared.stderr.strip().splitlines() or ["no message"])[-1]
            raise SystemExit(f"{study}: the {split} split's references are absent: {data} is missing and the "
                             f"study's PREPARE could not write it ({reason})")
    if not data.is_file():
        raise SystemExit(f"{study}: the {split} split's references are absent: {data} is missing")
    return test_prompts(study_config([env["TRAIN_BASE"]], str(data)))[2]


def rescore(outputs: Path, references: list[list[str]]) -> dict[str, float]:
    """The scores of an outputs file against its split's references, refused unless they equal the committed ones."""
    predictions = [json.loads(line)["prediction"] for line in outputs.read_text().splitlines()]
    if len(predictions) != len(references):
        raise SystemExit(f"{outputs}: {len(predictions)} outputs for the test split's {len(references)} rows")
    scores, committed = quality(predictions, references), json.loads(scores_of(outputs).read_text())
    for metric in METRICS:
        if not math.isclose(scores[metric], committed[metric], rel_tol=RESCORE_TOLERANCE):
            raise SystemExit(f"{outputs}: re-scored {metric} {scores[metric]!r} differs from the committed "
                             f"{committed[metric]!r} in {scores_of(outputs)}")
    return scores


def check(study: str, entry: dict) -> None:
    """Re-score a dataset's headline entry from its outputs and print ROUGE-L per seed, the means and the share."""
    missing = [key for key in ("skip", "dense", "speedup") if key not in entry]
    if missing:
        raise SystemExit(f"{headline_file()}: {study} lacks {missing}; allowed: write it with --set {study}")
    derived = headline_entry(study, [*map(name_of, entry["skip"])], [*map(name_of, entry["dense"])])
    for key, value in derived.items():
        if entry.get(key) != value:
            raise SystemExit(f"{headline_file()}: {study}'s {key} is {entry.get(key)!r}, but its rows give {value!r}")
    references = split_references(study)
    rouge_l = {side: {name_of(path): rescore(Path(path), references)["rouge_l"] for path in entry[side]}
               for side in ("skip", "dense")}
    means = {side: sum(values.values()) / len(values) for side, values in rouge_l.items()}
    print(f"{study}: test ROUGE-L re-scored from the outputs, each equal to its committed score "
          f"({entry['precision']}, {entry['decoding']}, {entry['speedup']:.2f}x)")
    for side, values in rouge_l.items():
        for name, value in values.items():
            print(f"  {side:5} {name}: {100 * value:.2f}")
        print(f"  {side:5} mean over {len(values)} seeds: {100 * means[side]:.2f}")
    print(f"  share of the dense ceiling: {100 * means['skip'] / means['dense']:.1f}%")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=DATASETS, help="name this dataset's headline rows and write the file")
    parser.add_argument("--skip", nargs="+", metavar="NAME", help="the skip configuration's seeds (with --set)")
    parser.add_argument("--dense", nargs="+", metavar="NAME", help="its dense ceiling's seeds (with --set)")
    args = parser.parse_args(argv)
    path = headline_file()
    if args.set:
        if not (args.skip and args.dense):
            parser.error("--set needs --skip NAME ... and --dense NAME ...")
        headline = json.loads(path.read_text()) if path.is_file() else {}
        headline[args.set] = headline_entry(args.set, args.skip, args.dense)
        write_whole(path, json.dumps(dict(sorted(headline.items())), indent=2) + "\n")
        print(f"{path}: {args.set} written; re-score it with python -m benchmarks.quality.headline")
        return
    if args.skip or args.dense:
        parser.error("--skip and --dense name rows for --set DATASET")
    if not path.is_file():
        raise SystemExit(f"{path} is missing: write it with --set DATASET --skip NAME ... --dense NAME ...")
    headline = json.loads(path.read_text())
    datasets.disable_progress_bars()  # reading a split's references is quick: its bars would bury the scores
    unknown = sorted(set(headline) - set(DATASETS))
    if unknown:
        raise SystemExit(f"{path}: unknown dataset(s) {unknown}; allowed: {', '.join(DATASETS)}")
    for study, entry in headline.items():
        check(study, entry)


if __name__ == "__main__":
    main()
