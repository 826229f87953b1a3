"""An export's ``custom_generate`` as plain transformers runs it, for a model in memory and a schedule."""

from __future__ import annotations

import tempfile
from collections.abc import Callable

from torch import nn

from skiptrain.core.schedules import SkipSchedule
from skiptrain.export.write import write_custom_generate


def export_generate(model: nn.Module, schedule: SkipSchedule) -> Callable:
    """The ``generate`` of an export of ``model`` under ``schedule``, loaded by transformers' own
    ``load_custom_generate`` (what ``generate(custom_generate=...)`` and ``from_pretrained(...,
    trust_remote_code=True)`` load). Call it as ``generate(model=model, input_ids=..., ...)`` with the options
    ``model.generate`` takes, and the export's own (``speculative_tokens``, ``draft_vocab``, ...).

    Sets ``model.config.skip_schedule`` (the ``config.json`` mirror the export's code reads) to ``schedule``.
    """
    model.config.skip_schedule = schedule.to_dict()
    with tempfile.TemporaryDirectory() as export:
        model.config.save_pretrained(export)
        write_custom_generate(export)
        return model.load_custom_generate(export, trust_remote_code=True)
