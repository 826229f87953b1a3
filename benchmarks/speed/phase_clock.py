"""A callback that clocks a fit's phases in process CPU time and wall time, and writes them as JSON at its end.

CPU time (``time.process_time``: this process's user + system time) is what a shared machine inflates least, so a
short run's per-step and per-validation CPU seconds project a full run's time on an idle machine of the same kind.
``benchmarks/speed/quickstart.py --phases`` adds it to the run it times. It clocks one run's phases and computes no
speed ratio, so it does not use the A/B timing protocol (:mod:`benchmarks.common.timing`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning as L


class PhaseClock(L.Callback):
    """Clock setup (until the first step), each training step, and each validation.

    Args:
        out: JSON file written at the end of the fit.
    """

    def __init__(self, out: str) -> None:
        self.out = out
        self.started = (time.process_time(), time.perf_counter())
        self.steps: list[tuple[float, float]] = []
        self.validations: list[tuple[float, float]] = []
        self.setup: tuple[float, float] | None = None
        self._mark = self.started

    def _since_mark(self) -> tuple[float, float]:
        now = (time.process_time(), time.perf_counter())
        return now[0] - self._mark[0], now[1] - self._mark[1]

    def _start(self) -> None:
        self._mark = (time.process_time(), time.perf_counter())

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if self.setup is None:
            self.setup = (time.process_time() - self.started[0], time.perf_counter() - self.started[1])
        self._start()

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        self.steps.append(self._since_mark())

    def on_validation_start(self, trainer: L.Trainer, *args: object) -> None:
        self._start()

    def on_validation_end(self, trainer: L.Trainer, *args: object) -> None:
        self.validations.append(self._since_mark())

    def on_fit_end(self, trainer: L.Trainer, *args: object) -> None:
        later = self.steps[1:] or self.steps  # the first step also warms up
        Path(self.out).write_text(json.dumps({
            "setup_cpu_s": round(self.setup[0], 1) if self.setup else None,
            "setup_wall_s": round(self.setup[1], 1) if self.setup else None,
            "step_cpu_s": [round(c, 2) for c, _ in self.steps], "step_wall_s": [round(w, 2) for _, w in self.steps],
            "mean_step_cpu_s_after_first": round(sum(c for c, _ in later) / max(len(later), 1), 3),
            "validation_cpu_s": [round(c, 1) for c, _ in self.validations],
            "validation_wall_s": [round(w, 1) for _, w in self.validations],
        }, indent=2) + "\n")
