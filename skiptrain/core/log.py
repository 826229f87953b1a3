"""What skiptrain says to the user: info lines on the ``skiptrain`` logger and warnings, from the first process only.

Pure Python (the core imports no torch): the process's rank is read from the variables that launchers set
(``RANK``, else ``LOCAL_RANK``, else ``SLURM_PROCID``; none set: a single process, rank 0), so inference and the
export format say what they do without the training stack. As Lightning does for its own logger, the ``skiptrain``
logger prints on stderr when the program has configured no logging of its own; otherwise its records go to the
program's handlers.
"""

from __future__ import annotations

import logging
import os
import warnings

LOGGER = logging.getLogger("skiptrain")
LOGGER.setLevel(logging.INFO)
if not logging.getLogger().hasHandlers():
    LOGGER.addHandler(logging.StreamHandler())  # stderr, the bare message

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID")
"""Environment variables that launchers (torchrun, Lightning, SLURM) set to a process's rank, first found wins."""


def rank() -> int:
    """This process's rank as its launcher set it (0 when none did)."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def info(message: str) -> None:
    """Say ``message`` (one line) on the ``skiptrain`` logger, from rank 0 only."""
    if rank() == 0:
        LOGGER.info(message)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn with ``message`` (one line) from rank 0 only, attributed to the caller's caller."""
    if rank() == 0:
        warnings.warn(message, category, stacklevel=3)


__all__ = ["LOGGER", "info", "rank", "warn"]
