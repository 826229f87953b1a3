"""The export's schedule as the shipped code reads it: the ``skip_schedule`` key of ``config.json``, checked.

The ``config.json`` mirror of ``skip_schedule.json`` holds the schedule as layer lists, so the shipped code needs no
schedule family: ``prompt_layers`` for prompt columns and ``executed_layers[g]`` for generated index ``g`` (the last
entry for every index past the table). skiptrain's own reader of the same record is tested to refuse and accept
the same records.
"""

from __future__ import annotations

from typing import Any

CONFIG_KEY = "skip_schedule"
FORMAT = "skiptrain.skip_schedule"
SCHEMA_VERSION = 1
POSITION = "generated_index"


class SkipScheduleError(ValueError):
    """The schedule, the model or the call cannot be decoded exactly under the skip schedule."""


def read_schedule(config: Any) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``(prompt_layers, executed_layers)`` from a model config's ``skip_schedule``, checked against the contract.

    Raises:
        SkipScheduleError: naming the key when the mirror is missing, of another format, version or position, built
            for another layer count, or its layer lists are not ascending, nested sets containing layer 0.
    """
    record = getattr(config, CONFIG_KEY, None)
    if not isinstance(record, dict):
        raise SkipScheduleError(f"config.json has no '{CONFIG_KEY}' object: allowed the mirror of skip_schedule.json "
                                "that skiptrain export writes")
    expected = {"format": FORMAT, "schema_version": SCHEMA_VERSION, "position": POSITION,
                "num_layers": config.num_hidden_layers}
    for key, value in expected.items():
        if record.get(key) != value:
            raise SkipScheduleError(f"config.json {CONFIG_KEY}.{key}={record.get(key)!r} is invalid: allowed {value!r}")
    prompt = tuple(record.get("prompt_layers") or ())
    table = tuple(tuple(s) for s in record.get("executed_layers") or ())
    if not table:
        raise SkipScheduleError(f"config.json {CONFIG_KEY}.executed_layers is empty: allowed at least one entry")
    previous = set(range(config.num_hidden_layers))
    for name, layers in [("prompt_layers", prompt)] + [(f"executed_layers[{g}]", s) for g, s in enumerate(table)]:
        if list(layers) != sorted(set(layers)) or 0 not in layers or not set(layers) <= previous:
            raise SkipScheduleError(f"config.json {CONFIG_KEY}.{name}={list(layers)} is invalid: allowed ascending "
                                    "layer indices containing layer 0, a subset of the set before it (nesting)")
        previous = set(layers)
    return prompt, table
