"""One timing protocol for every speed claim: interleaved rounds of passes, and the median of per-round ratios with
its spread.

- **Interleaved rounds.** Each round runs every arm once; the order rotates by one arm per round (AB, BA, AB, ...;
  ABC, BCA, CAB, ...), so no arm always goes first and drift in the machine's speed hits every arm alike.
  ``warmup`` rounds run first and are not kept; then ``rounds`` timed rounds (5 by default).
- **Two clocks.** Each pass is timed in wall time (``time.perf_counter``) and in this process's CPU time
  (``time.process_time``: user + system time of all its threads), which a shared machine inflates least. A pass whose
  work runs in another process (an engine, a subprocess) returns :class:`Done` with the CPU seconds it measured
  there, or ``None``.
- **Pairs.** A comparison of a candidate arm against a baseline arm pairs their passes round by round; a pair's
  ratio is baseline seconds / candidate seconds (a speedup: above 1 the candidate is faster). Reported, for wall and
  for CPU time: the median ratio, the min and max, and a distribution-free confidence interval of the median: the
  order statistics ``[r_(k), r_(n+1-k)]`` of the ``n`` ratios with the largest ``k`` whose coverage
  ``1 - 2 P(Binomial(n, 1/2) < k)`` is at least 95%, or the min and max where ``n`` is too small for 95% (5 pairs
  give 93.75%); the coverage is recorded beside it. :func:`claim` writes a ratio whose interval holds 1.0, or
  one of fewer than 5 pairs, as "not shown".
- **Same work.** Every pass returns a fingerprint of the work it did (token or step counts, a hash of its outputs);
  a comparison whose arms' fingerprints differ in any round reports no ratio, only why.
- **The machine.** :func:`benchmarks.common.machine.describe` and the load average before and after the rounds.

    timing = run({"dense": lambda: decode(dense), "skip": lambda: decode(skip)}, rounds=5, warmup=1)
    timing.report({"skip": ("dense", "skip")})  # the JSON: every pass, and the comparison with its claim
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from math import comb
from typing import Any

from benchmarks.common.machine import describe

LEVEL = 0.95
"""The coverage the interval of the median aims at."""
MIN_COVERAGE = 0.9
"""The least coverage a claim stands on: 5 pairs (93.75%); 4 pairs' min..max covers only 87.5%."""


@dataclass(frozen=True)
class Done:
    """What a pass returns when its work ran in another process: its work fingerprint, and the CPU seconds measured
    there (``None`` where unknown), which replace this process's."""

    work: Any
    cpu_s: float | None = None


@dataclass(frozen=True)
class Pass:
    """One timed pass of an arm: wall and CPU seconds, and the fingerprint of the work it did."""

    wall_s: float
    cpu_s: float | None
    work: Any

    def minus(self, other: Pass) -> Pass:
        """This pass's seconds less ``other``'s, of the same round (e.g. a whole decode less its one-token decode)."""
        cpu = None if self.cpu_s is None or other.cpu_s is None else self.cpu_s - other.cpu_s
        return Pass(self.wall_s - other.wall_s, cpu, self.work)


def median_wall(passes: Sequence[Pass]) -> float:
    """The median wall seconds of an arm's passes (a rate's denominator: tokens / median seconds)."""
    return statistics.median(p.wall_s for p in passes)


def order(arms: Sequence[str], round_index: int) -> list[str]:
    """The arms in the order round ``round_index`` runs them: rotated by one arm per round."""
    shift = round_index % len(arms)
    return [*arms[shift:], *arms[:shift]]


def measure(fn: Callable[[], Any], clock: Callable[[], float] = time.perf_counter,
            cpu_clock: Callable[[], float] = time.process_time) -> Pass:
    """Time one call of ``fn``, which returns its work fingerprint or a :class:`Done`."""
    wall, cpu = clock(), cpu_clock()
    result = fn()
    wall_s, cpu_s = clock() - wall, cpu_clock() - cpu
    if isinstance(result, Done):
        return Pass(wall_s, result.cpu_s, result.work)
    return Pass(wall_s, cpu_s, result)


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(low, high, coverage)``: the distribution-free interval of the median of ``values`` (see the module)."""
    ranked, n = sorted(values), len(values)

    def coverage(k: int) -> float:
        return 1 - 2 * sum(comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return ranked[k - 1], ranked[n - k], coverage(k)


def spread(ratios: Sequence[float]) -> dict:
    """The median of per-pair ``ratios``, their min and max, the interval of the median and its coverage."""
    low, high, coverage = median_interval(ratios)
    return {"median": statistics.median(ratios), "low": low, "high": high, "coverage": coverage,
            "min": min(ratios), "max": max(ratios), "pair_ratios": list(ratios)}


def compare(baseline: Sequence[Pass], candidate: Sequence[Pass]) -> dict:
    """Round-by-round ratios of ``baseline`` over ``candidate`` passes, as :func:`spread` for wall and for CPU time
    (``None`` where a pass has no CPU time), or only ``refused`` where the two did different work in some round."""
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError(f"pairs need as many passes in each arm, at least one: {len(baseline)} and {len(candidate)}")
    differing = [i for i, (b, c) in enumerate(zip(baseline, candidate, strict=True)) if b.work != c.work]
    if differing:
        return {"pairs": len(baseline), "refused": f"different work in rounds {differing}: no ratio"}
    pairs = list(zip(baseline, candidate, strict=True))
    has_cpu = all(p.cpu_s is not None for pair in pairs for p in pair)
    return {"pairs": len(pairs), "wall": spread([b.wall_s / c.wall_s for b, c in pairs]),
            "cpu": spread([b.cpu_s / c.cpu_s for b, c in pairs]) if has_cpu else None}


def claim(stats: dict | None) -> str:
    """A speedup as a claim: ``1.31x (1.22-1.40)``, or ``not shown (0.93-1.12)`` where its interval holds 1.0, or
    ``not shown (4 pairs)`` where too few pairs give the interval less than :data:`MIN_COVERAGE`."""
    if stats is None:
        return "not measured"
    if stats["coverage"] < MIN_COVERAGE:
        return f"not shown ({len(stats['pair_ratios'])} pairs)"
    interval = f"({stats['low']:.2f}-{stats['high']:.2f})"
    return f"not shown {interval}" if stats["low"] <= 1 <= stats["high"] else f"{stats['median']:.2f}x {interval}"


def claims(comparison: dict) -> dict:
    """``comparison`` (:func:`compare`) with its wall and CPU claims added."""
    if "refused" in comparison:
        return comparison | {"claim_wall": "refused", "claim_cpu": "refused"}
    return comparison | {"claim_wall": claim(comparison["wall"]), "claim_cpu": claim(comparison["cpu"])}


@dataclass
class Timing:
    """The timed passes of interleaved rounds (:func:`run`), the order they ran in, and the machine around them."""

    warmup: int
    order: list[list[str]]
    passes: dict[str, list[Pass]]
    machine: dict
    load_before: list[float]
    load_after: list[float] = field(default_factory=list)

    def compare(self, baseline: str, candidate: str) -> dict:
        """:func:`compare` of two arms, with its claims."""
        return claims(compare(self.passes[baseline], self.passes[candidate]))

    def report(self, comparisons: Mapping[str, tuple[str, str]]) -> dict:
        """The JSON: the protocol, machine and load, every pass, and each named ``(baseline, candidate)``
        comparison."""
        return {
            "protocol": f"{len(self.order)} interleaved rounds (order rotated per round) after {self.warmup} warm-up; "
                        "ratio = baseline s / candidate s per round; median, min/max and a distribution-free "
                        "interval of the median (benchmarks/common/timing.py)",
            "machine": self.machine, "load_average_before": self.load_before, "load_average_after": self.load_after,
            "order": self.order,
            "passes": {arm: [asdict(p) for p in passes] for arm, passes in self.passes.items()},
            "comparisons": {name: {"baseline": b, "candidate": c, **self.compare(b, c)}
                            for name, (b, c) in comparisons.items()},
        }


def progress(line: str) -> None:
    """Print one pass's line at once (a long benchmark's log is read while it runs)."""
    print(line, flush=True)


def run(arms: Mapping[str, Callable[[], Any]], rounds: int = 5, warmup: int = 1, label: str = "",
        clock: Callable[[], float] = time.perf_counter, cpu_clock: Callable[[], float] = time.process_time,
        log: Callable[[str], None] | None = progress) -> Timing:
    """Run ``warmup`` then ``rounds`` interleaved rounds of ``arms`` (name -> pass function returning its work
    fingerprint or a :class:`Done`), logging each timed pass (prefixed by ``label``) through ``log``."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds={rounds}, warmup={warmup}: allowed rounds >= 1, warmup >= 0")
    names = list(arms)
    timing = Timing(warmup, [], {name: [] for name in names}, describe(), list(os.getloadavg()))
    for index in range(warmup + rounds):
        ran = order(names, index)
        for name in ran:
            done = measure(arms[name], clock, cpu_clock)
            if index >= warmup:
                timing.passes[name].append(done)
                if log is not None:
                    cpu = "-" if done.cpu_s is None else f"{done.cpu_s:.3f}"
                    log(f"{label}{name} round {index - warmup + 1}/{rounds}: {done.wall_s:.3f} s wall, {cpu} s CPU")
        if index >= warmup:
            timing.order.append(ran)
    timing.load_after = list(os.getloadavg())
    return timing
