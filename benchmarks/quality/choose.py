"""Dev's choice of a summarisation study's 2x headline configuration, by the rule benchmarks/quality/queue.sh set
before the rows it chooses among were scored:

1. A row's length is its epochs: one, or two with ``two_epochs`` (the learning rate annealed over them either way).
2. A skip row's ceiling is the dense row with the best dev ROUGE-L among those trained no longer than it.
3. A lever row (flat 2x with levers beyond the plain ones) replaces the plain flat 2x row of its length when its dev
   ROUGE-L is higher and its dev cross entropy under the schedule (``val/loss_skip``) lower. Where the two disagree,
   it replaces it only when its paired 95% interval against the plain row (:mod:`benchmarks.quality.paired`) lies
   above 100%; otherwise the row with fewer levers stays.
4. The headline is the row left with the highest dev share of its ceiling; a tie goes to the shorter row.

    python -m benchmarks.quality.choose cnndm

Candidates: the study's seed-0 rows (no ``_sN``), decoded as trained (no ``@``), trained whole (no ``five_epochs``),
LoRA r=64 on every linear layer in float32 (``lora_all_r64`` and ``fp32``), dense or flat 2x. The choice is made over
the rows scored so far: run it once the queued rows are all in.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import datasets

from benchmarks.quality import paired, study_report

BASE = {"lora_all_r64", "fp32"}  # every candidate's
PLAIN = BASE | {"accumulate2", "accumulate4", "two_epochs"}  # levers that change neither objective nor model
SCHEDULES = ("dense", "flat2x")


@dataclass(frozen=True)
class Row:
    name: str
    rouge_l: float  # dev, 0-1
    loss: float  # dev cross entropy under the row's schedule, at the end of training

    @property
    def schedule(self) -> str:
        return self.name.split("+")[0]

    @property
    def epochs(self) -> int:
        return 2 if "two_epochs" in self.levers else 1

    @property
    def levers(self) -> set[str]:
        return set(self.name.split("+")[1:])

    @property
    def extra(self) -> set[str]:
        """The levers beyond the plain ones (``joint``, ``distill_dense1``, ...)."""
        return self.levers - PLAIN


@dataclass(frozen=True)
class Verdict:
    row: Row
    ceiling: Row
    kept: bool
    why: str

    @property
    def share(self) -> float:
        return self.row.rouge_l / self.ceiling.rouge_l


def ceiling(row: Row, dense: list[Row]) -> Row:
    """Rule 2."""
    allowed = [d for d in dense if d.epochs <= row.epochs]
    if not allowed:
        raise SystemExit(f"{row.name}: no dense row trained {row.epochs} epoch(s) or fewer has been scored on dev")
    return max(allowed, key=lambda d: d.rouge_l)


def lever_verdict(row: Row, plain: Row, interval: Callable[[str, str], tuple[float, float]]) -> tuple[bool, str]:
    """Rule 3: whether lever row ``row`` replaces ``plain``, and why."""
    higher, lower = row.rouge_l > plain.rouge_l, row.loss < plain.loss
    if higher and lower:
        return True, f"beats {plain.name} on dev ROUGE-L and cross entropy"
    if not higher and not lower:
        return False, f"loses to {plain.name} on dev ROUGE-L and cross entropy"
    low, high = interval(row.name, plain.name)
    verdict = low > 1
    return verdict, (f"{'higher' if higher else 'lower'} dev ROUGE-L but {'lower' if lower else 'higher'} cross "
                     f"entropy than {plain.name}; paired interval {100 * low:.1f}-{100 * high:.1f}% "
                     + ("lies above 100%" if verdict else "does not lie above 100%"))


def choose(rows: list[Row], interval: Callable[[str, str], tuple[float, float]]) -> list[Verdict]:
    """Every skip row's verdict, the kept ones first by dev share: the first is the headline (rule 4)."""
    dense = [r for r in rows if r.schedule == "dense" and not r.extra]
    skip = [r for r in rows if r.schedule != "dense"]
    verdicts = []
    for row in (r for r in skip if r.extra):
        plain = [p for p in skip if not p.extra and p.epochs == row.epochs]
        if len(plain) != 1:
            raise SystemExit(f"{row.name}: needs exactly one plain {row.schedule} row of {row.epochs} epoch(s) scored "
                             f"on dev, found {', '.join(p.name for p in plain) or 'none'}")
        verdicts.append(Verdict(row, ceiling(row, dense), *lever_verdict(row, plain[0], interval)))
    for row in (r for r in skip if not r.extra):
        beaten_by = [v.row.name for v in verdicts if v.kept and v.row.epochs == row.epochs]
        verdicts.append(Verdict(row, ceiling(row, dense), not beaten_by,
                                f"replaced by {', '.join(beaten_by)}" if beaten_by else "plain"))
    return sorted(verdicts, key=lambda v: (not v.kept, -v.share, v.row.epochs, len(v.row.extra)))


def candidates(study: str) -> list[Row]:
    """The study's candidate rows (see the module docstring) with their dev scores and final dev losses."""
    rows = []
    for name, splits in study_report.read_scores(study).items():
        levers = set(name.split("+")[1:])
        if (study_report.seedless(name) != name or "@" in name or "five_epochs" in levers or not BASE <= levers
                or name.split("+")[0] not in SCHEDULES or "dev" not in splits):
            continue
        trained = study_report.training_summary(study, name)
        if trained is None or trained.get("val_loss_schedule") is None:
            raise SystemExit(f"{study}: row {name!r} is scored on dev but its run recorded no dev cross entropy")
        rows.append(Row(name, splits["dev"]["rouge_l"], trained["val_loss_schedule"]))
    return rows


def report(study: str, verdicts: list[Verdict]) -> str:
    """Markdown: each skip row's verdict, then the headline."""
    lines = [f"Dev's choice for {study} (python -m benchmarks.quality.choose {study}; the rule: "
             "benchmarks/quality/choose.py)", "",
             "| skip row | epochs | dev ROUGE-L | dev cross entropy | ceiling (dev ROUGE-L) | dev share | verdict |",
             "|---|---:|---:|---:|---|---:|---|"]
    for v in verdicts:
        lines.append(f"| {v.row.name} | {v.row.epochs} | {100 * v.row.rouge_l:.1f} | {v.row.loss:.3f} | "
                     f"{v.ceiling.name} ({100 * v.ceiling.rouge_l:.1f}) | {100 * v.share:.1f}% | "
                     f"{'kept' if v.kept else 'out'}: {v.why} |")
    head = verdicts[0]
    return "\n".join([*lines, "", f"Headline: {head.row.name} against {head.ceiling.name}, dev share "
                                  f"{100 * head.share:.1f}%"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="a study of benchmarks/quality/STUDY/study.env, e.g. cnndm or xsum")
    args = parser.parse_args(argv)
    if not (study_report.STUDIES / args.study / "study.env").is_file():
        parser.error(f"study {args.study!r} has no {study_report.STUDIES / args.study / 'study.env'}")
    rows = candidates(args.study)
    if not any(r.schedule != "dense" for r in rows):
        raise SystemExit(f"{args.study}: no candidate skip row is scored on dev yet (candidates: seed 0, "
                         f"{' + '.join(sorted(BASE))}, {' or '.join(SCHEDULES)}, not five_epochs)")
    datasets.disable_progress_bars()

    def interval(skip: str, dense: str) -> tuple[float, float]:
        result = paired.compare(args.study, [skip], [dense], "dev")
        return result.low, result.high

    print(report(args.study, choose(rows, interval)))


if __name__ == "__main__":
    main()
