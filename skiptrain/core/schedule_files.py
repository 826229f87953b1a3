"""Files a user hands skiptrain that describe schedules: a schedule or a schedule family, and a calibration grid.

An export directory's own ``skip_schedule.json`` is read by :func:`~skiptrain.export.format.schedule_from_export`,
which names the export in its errors; this module reads a file given as an option, and says which option.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from skiptrain.core.schedules import FAMILIES, ScheduleError, SkipSchedule
from skiptrain.errors import InputError, UsageError


def schedule_from_file(path: str, num_layers: int, option: str = "schedule") -> SkipSchedule:
    """A schedule for a model of ``num_layers`` layers from a file, validated for it.

    ``.json``: a ``skip_schedule.json`` (an export's). ``.yaml``/``.yml``: a schedule family as recipes write it,
    ``{class_path: skiptrain.Ranked, init_args: {...}}``, alone or under ``model.schedule`` (a recipe fragment), built
    for ``num_layers``.

    Raises:
        InputError: for a missing or unreadable file, or one that is not valid YAML.
        ScheduleError: naming ``option`` and the file, for content that is not a valid schedule for the model.
    """
    origin = f"{option}={path!r}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{origin} cannot be read ({err.__class__.__name__}): give a skip_schedule.json or a schedule "
                         "YAML (class_path/init_args)") from err
    try:
        if Path(path).suffix.lower() == ".json":
            schedule = SkipSchedule.from_json(text)
        else:
            schedule = _family_from_yaml(text).build(num_layers)
        schedule.check_num_layers(num_layers)
    except yaml.YAMLError as err:
        raise InputError(f"{origin} is not valid YAML: {' '.join(str(err).split())}") from err
    except (ScheduleError, TypeError) as err:
        raise ScheduleError(f"{origin}: {err}") from err
    return schedule


def _family_from_yaml(text: str) -> Any:
    """The family a ``class_path``/``init_args`` YAML (alone or under ``model.schedule``) configures."""
    spec = yaml.safe_load(text)
    spec = spec.get("model", {}).get("schedule", spec) if isinstance(spec, dict) else spec
    classes = {family.__name__: family for family in FAMILIES.values()}
    class_path = spec.get("class_path") if isinstance(spec, dict) else spec
    name = str(class_path or "").rsplit(".", 1)[-1] if isinstance(spec, dict) else ""
    if name not in classes:
        raise ScheduleError(f"class_path={class_path!r} is invalid: allowed one of {sorted(classes)} "
                            "(skiptrain.Ranked, ...)")
    return classes[name](**(spec.get("init_args") or {}))


def read_grid(path: str | os.PathLike) -> dict[str, dict[str, list[Any]]]:
    """A calibration grid file: ``{family: {parameter: [values]}}`` (a single value counts as a list of one).

    Raises:
        InputError: for a file that cannot be read as YAML.
        UsageError: for YAML that is not such a mapping.
    """
    try:
        grid = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise InputError(f"grid={str(path)!r} cannot be read ({' '.join(str(err).split())}): allowed a YAML file "
                         "{family: {parameter: [values]}}") from err
    if not isinstance(grid, dict) or not all(isinstance(axes, dict) for axes in grid.values()):
        raise UsageError(f"grid={str(path)!r} is invalid: allowed a YAML mapping {{family: {{parameter: [values]}}}}")
    return {name: {k: v if isinstance(v, list) else [v] for k, v in axes.items()} for name, axes in grid.items()}


__all__ = ["read_grid", "schedule_from_file"]
