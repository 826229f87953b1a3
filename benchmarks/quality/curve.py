"""Tabulate and plot a study's budget curve: each configuration's share of the same-budget dense ceiling along one
training budget, the training pairs (E2E) or the epochs (the summarisation studies).

    python -m benchmarks.quality.curve e2e --axis pairs --plot benchmarks/results/e2e/data_curve.png \
        > benchmarks/results/e2e/data_curve.md
    python -m benchmarks.quality.curve cnndm --axis epochs --metric rouge_l \
        --plot benchmarks/results/cnndm/epochs_curve.png > benchmarks/results/cnndm/epochs_curve.md

A run of benchmarks/quality/study.sh is named SCHEDULE+LEVER+... (``_sN``: seed N); its budget levers place it on
the axis, and the rest name its configuration:
- pairs: none is the study base's 2,000 pairs, ``train4k`` and ``train8k`` the subsets of
  benchmarks/quality/e2e/prepare_train.py; one epoch each. The dev split is the matched one (``devmatch``).
- epochs: ``five_epochs`` trains one run for five epochs with the learning rate decaying over all five; its final
  scores are the point at 5 epochs, and ``SCHEDULE+LEVERS+epochE`` (study.sh's EPOCH=E) the point at E: the same run
  part-way, its learning rate not yet annealed, so not the run that a budget of E epochs would train. A run without
  ``five_epochs`` trained one epoch (``two_epochs``: two) with the learning rate annealed over it: such runs form
  lines of their own, named without ``five_epochs``, and never join a five-epoch run's line.

The ``fp32`` lever names no configuration: each row's precision is the one its run recorded
(benchmarks/quality/trained_on.py), seeds are pooled only within one precision, and every point is divided by its
ceiling: the dense run with the same levers (less those given with ``--ceiling-without``, e.g. ``joint``, whose dense
partner is the run without it) at the same point of the axis, in the same precision, the mean of its seeds, on the
same split, as benchmarks/quality/study_report.py does for one budget. A configuration is on the curve once it was
scored at two points of the axis or more (the others are named on stderr); rows decoded another way
(``NAME@DECODE``) are not on it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.quality import study_report

PRECISION_LEVERS = ("fp32",)  # a precision lever keeps a row on the curve, in its own precision's rows
BASE_PAIRS = 2000  # the E2E study base's training pairs
SIZES = {"train4k": 4000, "train8k": 8000}  # lever -> training pairs
KEPT_EPOCHS, KEPT_EPOCHS_TOTAL = "five_epochs", 5  # the lever whose run keeps a checkpoint at every epoch of its 5
ANNEALED_EPOCHS = {"two_epochs": 2}  # lever -> epochs of a run annealed over them (none: one)
EPOCH_ROW = re.compile(r"epoch(\d+)")


@dataclass(frozen=True)
class Point:
    """Where a scored run sits on an axis: ``position`` (pairs or epochs), its configuration's ``levers`` (the budget
    levers taken out), and the ``trained`` share of its run's training that the point saw."""

    position: int
    levers: tuple[str, ...]
    trained: float = 1.0


def pairs_point(levers: list[str]) -> Point | None:
    """The training pairs of a run with at most one size lever (none: the study base's)."""
    sizes = [lever for lever in levers if lever in SIZES]
    if len(sizes) > 1:
        return None
    return Point(SIZES[sizes[0]] if sizes else BASE_PAIRS, tuple(lever for lever in levers if lever not in SIZES))


def epochs_point(levers: list[str]) -> Point | None:
    """The epochs of a run: a five-epoch run's ``epochE`` row is epoch E of its line (its own row: 5), and a run
    without that lever trained one epoch, or the epochs of its annealed-length lever, in a line named without it."""
    kept = [int(match[1]) for match in map(EPOCH_ROW.fullmatch, levers) if match]
    annealed = [ANNEALED_EPOCHS[lever] for lever in levers if lever in ANNEALED_EPOCHS]
    rest = tuple(lever for lever in levers if lever not in ANNEALED_EPOCHS and not EPOCH_ROW.fullmatch(lever))
    if KEPT_EPOCHS in levers:
        if annealed or len(kept) > 1:
            return None
        epoch = kept[0] if kept else KEPT_EPOCHS_TOTAL  # study.sh EPOCH=E, or the run's own last checkpoint
        return Point(epoch, rest, epoch / KEPT_EPOCHS_TOTAL)
    if kept or len(annealed) > 1:  # an epoch checkpoint only a five-epoch run keeps
        return None
    return Point(annealed[0] if annealed else 1, rest)


@dataclass(frozen=True)
class Axis:
    """One training budget: how a run's levers place it, the dev split it is chosen on, and the table's wording."""

    point: Callable[[list[str]], Point | None]  # a run's levers (less the precision's) -> its point
    heading: str  # the first column
    label: str  # the plot's x axis
    dev: tuple[str, str]  # (split, its name in the table)
    minutes: str  # the last column
    log: bool = False
    caption: str = ""


AXES = {
    "pairs": Axis(pairs_point, "training pairs", "training pairs (one epoch)", ("devmatch", "matched dev"),
                  "train minutes (mean)", log=True),
    "epochs": Axis(epochs_point, "epochs", "epochs trained", ("dev", "dev"),
                   "train minutes to this epoch (mean; a five-epoch run's total x E/5)",
                   caption=f"The points before the last of a `{KEPT_EPOCHS}` configuration are that one run part-way "
                   "(its checkpoint at the end of epoch E, the learning rate still decaying over five epochs), each "
                   "divided by the dense run of the same levers at the same epoch; a configuration without "
                   f"`{KEPT_EPOCHS}` trained each of its epoch counts as a run of its own, annealed over it."),
}


def configuration_point(axis: Axis, name: str) -> tuple[str, Point] | None:
    """``(configuration, point)`` of a scored run on the axis; ``None`` for any other run (decoded under another
    schedule, ``NAME@SCHEDULE``, or budget levers the axis cannot place)."""
    if "@" in name:
        return None
    schedule, *levers = study_report.seedless(name).split("+")
    point = axis.point([lever for lever in levers if lever not in PRECISION_LEVERS])
    return (None if point is None else ("+".join([schedule, *point.levers]), point))


def ceiling_of(configuration: str, without: list[str]) -> str:
    """The dense configuration a configuration's points are divided by: its levers, less ``without``."""
    return "+".join(["dense", *(lever for lever in configuration.split("+")[1:] if lever not in without)])


def line_order(configuration: str) -> tuple:
    """Dense first, then by the schedule's nominal speedup (``...2x``), the flat schedule before the other shapes."""
    schedule = configuration.split("+")[0]
    nominal = re.search(r"(\d+)x$", schedule)
    return (1 if schedule == "dense" else int(nominal[1]) if nominal else float("inf"),
            not schedule.startswith("flat"), configuration)


def mean(scores: dict[str, dict[str, dict]], runs: list[str], split: str, key: str) -> float | None:
    """Mean of ``key`` over the runs scored on ``split`` (``None``: none was)."""
    values = [scores[run][split][key] for run in runs if split in scores[run]]
    return sum(values) / len(values) if values else None


def seeds_scored(scores: dict[str, dict[str, dict]], runs: list[str], split: str) -> int:
    """How many of the runs (a point's seeds) were scored on ``split``."""
    return sum(split in scores[run] for run in runs)


def share_of_ceiling(scores: dict[str, dict[str, dict]], runs: list[str], ceiling: list[str], split: str,
                     metric: str) -> tuple[float | None, float | None]:
    """The runs' mean ``metric`` on ``split`` and its share (%) of the ceiling seeds' mean there, the one share that
    the table and the plot both show (``None`` where the runs, or the ceiling, were not scored on the split)."""
    value, dense = mean(scores, runs, split, metric), mean(scores, ceiling, split, metric)
    return value, (100 * value / dense if value is not None and dense else None)


@dataclass
class Curve:
    """A study's scores by run and split, and its runs on one axis grouped by (position, precision, configuration):
    the seeds of each point, distinct trained runs."""

    study: str
    axis: Axis
    scores: dict[str, dict[str, dict]]
    groups: dict[tuple[int, str, str], list[str]]
    trained: dict[str, float]  # run -> the share of its run's training that its point saw
    left_out: list[str]  # configurations scored at one point of the axis only
    without: list[str]

    @property
    def splits(self) -> tuple[str, str]:
        """The test split, then the dev split the axis's choices are made on."""
        return "test", self.axis.dev[0]

    def ceiling(self, position: int, trained_in: str, configuration: str) -> list[str]:
        """The seeds of a point's ceiling (none where its dense run was not scored there)."""
        return self.groups.get((position, trained_in, ceiling_of(configuration, self.without)), [])

    def lines(self) -> list[tuple[str, str]]:
        """Each (precision, configuration) on the curve, in the table's order."""
        return sorted({(trained_in, configuration) for _, trained_in, configuration in self.groups},
                      key=lambda line: (line_order(line[1]), line[0]))


def read_curve(study: str, axis: Axis, without: list[str] = ()) -> Curve:
    """The study's scores (benchmarks/results/STUDY/study/NAME.SPLIT.json) placed on ``axis``; ``without``: the
    levers that the ceilings leave out."""
    folder = study_report.RESULTS / study / "study"
    if not folder.is_dir():
        raise SystemExit(f"no study {study!r}: {folder} is missing (studies: e2e, xsum, cnndm)")
    scores = study_report.read_scores(study)
    groups: dict[tuple[int, str, str], list[str]] = {}
    trained: dict[str, float] = {}
    counted: set[tuple[int, str]] = set()  # a five-epoch run's final row and an EPOCH=5 row are one model
    positions: dict[str, set[int]] = {}
    # a run's own row (its last checkpoint) before the rows of its epoch checkpoints
    for name in sorted(scores, key=lambda name: (study_report.trained_run(name) != name, name)):
        placed = configuration_point(axis, name)
        if placed is None or (placed[1].position, study_report.trained_run(name)) in counted:
            continue
        configuration, point = placed
        counted.add((point.position, study_report.trained_run(name)))
        positions.setdefault(configuration, set()).add(point.position)
        trained[name] = point.trained
        groups.setdefault((point.position, study_report.precision(study, name), configuration), []).append(name)
    left_out = sorted(configuration for configuration, at in positions.items() if len(at) < 2)
    groups = {key: runs for key, runs in groups.items() if key[2] not in left_out}
    return Curve(study, axis, scores, groups, trained, left_out, list(without))


def row(curve: Curve, runs: list[str], ceiling: list[str], metric: str) -> list[str]:
    """The cells of one configuration at one point and precision, after its name; ``ceiling``: the dense seeds of
    that point and precision (none: no shares)."""
    scores = curve.scores
    cells = ["/".join(str(seeds_scored(scores, runs, split)) for split in curve.splits)]
    for split in curve.splits:
        value, share = share_of_ceiling(scores, runs, ceiling, split, metric)
        cells.append("-" if value is None else f"{100 * value:.1f}")
        cells.append("-" if share is None else f"{share:.0f}%")
    speedups = [(split, mean(scores, runs, split, "ideal_speedup_over_generated_tokens")) for split in curve.splits]
    split, speedup = next(((split, value) for split, value in speedups if value is not None), (None, None))
    cells.append("-" if speedup is None else f"{speedup:.2f}x" + ("" if split == "test" else f" ({split})"))
    trained = [(curve.trained[run], t) for run in runs
               if (t := study_report.training_summary(curve.study, study_report.trained_run(run)))]
    # a record may have lost its time
    timed = [(share, seconds) for share, t in trained if (seconds := study_report.attempt_seconds(t))]
    resumed = sum(len(seconds) > 1 for _, seconds in timed)
    minutes = f"{sum(share * sum(seconds) for share, seconds in timed) / 60 / len(timed):.0f}" if timed else "-"
    notes = []
    if resumed:
        notes.append(f"{resumed} resumed")
    if len(timed) < len(trained):
        notes.append(f"{len(trained) - len(timed)} untimed")
    cells.append(minutes + (f" ({', '.join(notes)})" if notes else ""))
    return cells


def print_table(curve: Curve, metric: str) -> None:
    dev = curve.axis.dev[1]
    print(f"| {curve.axis.heading} | precision | configuration | seeds: test / {dev} | test {metric} "
          f"| test share of the same-budget ceiling | {dev} {metric} | {dev} share "
          f"| layer-count speedup over generated tokens (test) | {curve.axis.minutes} |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    order = {line: index for index, line in enumerate(curve.lines())}
    for (position, trained_in, configuration), runs in sorted(
            curve.groups.items(), key=lambda item: (item[0][0], item[0][1], order[item[0][1:]])):
        cells = [str(position), trained_in, configuration,
                 *row(curve, runs, curve.ceiling(position, trained_in, configuration), metric)]
        print(f"| {' | '.join(cells)} |")
    notes = [curve.axis.caption] if curve.axis.caption else []
    if curve.without:
        notes.append(f"Ceilings leave out {', '.join(f'`{lever}`' for lever in curve.without)}: a configuration with "
                     "such a lever is divided by the dense run without it.")
    if notes:
        print("\n" + " ".join(notes))
    if curve.left_out:
        print(f"not on the curve (scored at one point of it only): {', '.join(curve.left_out)}", file=sys.stderr)


def plot(curve: Curve, metric: str, path: str):
    """Each skip configuration's share of its same-budget, same-precision ceiling along the axis (top row), and
    every configuration's own ``metric``, dense included, to see which gained more (bottom row); a panel per split,
    a colour per configuration, a dash per precision; a hollow marker is a one-seed point. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    positions = sorted({position for position, _, _ in curve.groups})
    configurations = sorted({configuration for _, configuration in curve.lines()}, key=line_order)
    common = set.intersection(*(set(configuration.split("+")[1:]) for configuration in configurations)) \
        if configurations else set()
    figure, panels = plt.subplots(2, 2, figsize=(11, 8.5), sharex=True, sharey="row", layout="constrained")
    for column, (split, title) in enumerate(zip(curve.splits, ("test split", f"{curve.axis.dev[1]} split"),
                                                strict=True)):
        for trained_in, configuration in curve.lines():
            points = []  # (position, share in %, the metric in %, seeds scored on the split)
            for position in positions:
                runs = curve.groups.get((position, trained_in, configuration), [])
                value, share = share_of_ceiling(curve.scores, runs, curve.ceiling(position, trained_in, configuration),
                                                split, metric)
                if value is not None:
                    points.append((position, share, 100 * value, seeds_scored(curve.scores, runs, split)))
            color = f"C{configurations.index(configuration)}"  # one colour a configuration, a dash a precision
            label = "+".join(lever for lever in configuration.split("+") if lever not in common)
            style = {"color": color, "linestyle": "-" if trained_in == "32-true" else ":"}
            for panel, index in ((panels[0][column], 1), (panels[1][column], 2)):
                drawn = [(point[0], point[index], point[3]) for point in points if point[index] is not None]
                if not drawn or (index == 1 and configuration == ceiling_of(configuration, curve.without)):
                    continue  # a ceiling's own share is 100% by definition
                panel.plot([x for x, _, _ in drawn], [y for _, y, _ in drawn], **style,
                           label=f"{label}, {trained_in}")
                for x, y, seeds in drawn:
                    panel.plot(x, y, "o", color=color, markerfacecolor=color if seeds > 1 else "white")
        panels[0][column].axhline(100, color="grey", linewidth=0.8)
        panels[0][column].set_title(title)
        panels[1][column].set_xlabel(curve.axis.label)
        for panel in (panels[0][column], panels[1][column]):
            if curve.axis.log:
                panel.set_xscale("log", base=2)
            panel.set_xticks(positions, [f"{position:,}" for position in positions])
            panel.grid(alpha=0.3)
    panels[0][0].set_ylabel(f"{metric} share of the same-budget dense ceiling (%)")
    panels[1][0].set_ylabel(f"{metric} (mean of the seeds)")
    legend = {}  # label -> handle, from both splits: a configuration may be scored on dev alone
    for panel in panels[1]:
        for handle, label in zip(*panel.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    handles, labels = list(legend.values()), list(legend)
    figure.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8, title_fontsize=8,
                  title="filled marker: two or more seeds" + (f"; every line: {'+'.join(sorted(common))}" if common
                                                               else ""))
    figure.savefig(path, dpi=120)
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study")
    parser.add_argument("--axis", choices=sorted(AXES), required=True)
    parser.add_argument("--metric", default="bleu", choices=("bleu", "rouge_l", "rouge_1", "rouge_2"),
                        help="bleu (E2E) or rouge_l (the summarisation studies)")
    parser.add_argument("--ceiling-without", metavar="LEVER", action="append", default=[],
                        help="divide a configuration with this lever by the dense run without it (e.g. joint); "
                        "repeatable")
    parser.add_argument("--plot", metavar="PNG", help="also draw the curve")
    args = parser.parse_args()
    curve = read_curve(args.study, AXES[args.axis], args.ceiling_without)
    print_table(curve, args.metric)
    if args.plot:
        plot(curve, args.metric, args.plot)


if __name__ == "__main__":
    main()
