"""Reading one raw split: local files (by extension), a hub dataset, or the generated builtin task."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import datasets

from skiptrain.data.builtin_task import build_builtin_dataset
from skiptrain.errors import DataError


class MissingSplitError(DataError, KeyError):
    """A split the stage needs is not in the data files or the dataset (a ``KeyError`` too)."""

    __str__ = Exception.__str__  # the message, not KeyError's repr of it


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A local data file does not exist (a ``FileNotFoundError`` too)."""

    __str__ = Exception.__str__

# file extension -> (datasets builder, extra builder kwargs)
FILE_BUILDERS: dict[str, tuple[str, dict[str, Any]]] = {
    ".csv": ("csv", {"keep_default_na": False}),
    ".tsv": ("csv", {"keep_default_na": False, "sep": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
    ".txt": ("text", {"keep_linebreaks": True}),
    ".raw": ("text", {"keep_linebreaks": True}),
}


def infer_builder(paths: str | Sequence[str]) -> tuple[str, dict[str, Any]]:
    """Pick the ``datasets`` builder for local files from their extension.

    Args:
        paths: One path/glob or a list of them; all must share a builder.

    Returns:
        ``(builder_name, builder_kwargs)``, e.g. ``("csv", {"keep_default_na": False})``.

    Raises:
        ValueError: For an unsupported extension or a mix of builders.
    """
    path_list = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    choices: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in path_list:
        suffix = Path(str(path)).suffix.lower()
        if suffix not in FILE_BUILDERS:
            raise DataError(
                f"data file {str(path)!r} has unsupported extension {suffix!r}; supported: {sorted(FILE_BUILDERS)}"
            )
        choices[suffix] = FILE_BUILDERS[suffix]
    if len({(b, tuple(sorted(kw.items()))) for b, kw in choices.values()}) != 1:
        raise DataError(f"data files {path_list} mix formats {sorted(choices)}; use one format per split")
    builder, kwargs = next(iter(choices.values()))
    return builder, dict(kwargs)


@lru_cache(maxsize=4)
def _builtin_dataset(seed: int) -> datasets.DatasetDict:
    """The generated builtin task (cached: setup loads it once per split)."""
    return build_builtin_dataset(seed=seed)


def load_split(
    split: str,
    data_files: Mapping[str, str | Sequence[str]] | None,
    dataset_id: str | None,
    dataset_config: str | None,
    seed: int = 0,
) -> tuple[datasets.Dataset, str]:
    """Load one raw split from local files, the hub, or the generated builtin task.

    Args:
        split: Split name (a key of ``data_files`` for local files).
        data_files: Split -> local path(s); ``None`` to load ``dataset_id``.
        dataset_id: Hugging Face dataset id; ``None`` (with no ``data_files``) means the builtin task.
        dataset_config: Dataset config name.
        seed: Seed for the builtin task.

    Returns:
        ``(dataset, origin)`` where ``origin`` describes the data for messages.

    Raises:
        KeyError: If the split is not available (the message lists the available ones).
        FileNotFoundError: If a local file does not exist.
        ValueError: If the split is empty or unreadable.
    """
    if data_files is not None:
        if split not in data_files:
            raise MissingSplitError(f"split {split!r} not in data_files (available: {sorted(data_files)})")
        paths = data_files[split]
        path_list = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
        for path in path_list:
            if not any(ch in str(path) for ch in "*?[") and not Path(path).exists():
                raise DataFileNotFoundError(f"data_files[{split!r}]: {path} does not exist; give an existing file")
        origin = str(paths) if len(path_list) != 1 else str(path_list[0])
        builder, kwargs = infer_builder([str(p) for p in path_list])
        try:
            dataset = datasets.load_dataset(
                builder, data_files={split: [str(p) for p in path_list]}, split=split, **kwargs
            )
        except (datasets.exceptions.DatasetGenerationError, ValueError, StopIteration, UnicodeDecodeError) as err:
            raise DataError(
                f"{origin}: split {split!r} is empty or could not be read as {builder} ({type(err).__name__}: {err})"
            ) from err
    elif dataset_id is None:
        origin = "builtin weather task"
        dsd = _builtin_dataset(seed)
        if split not in dsd:
            raise MissingSplitError(f"split {split!r} not in {origin} (available: {sorted(dsd)})")
        dataset = dsd[split]
    else:
        origin = f"dataset {dataset_id!r}" + (f" (config {dataset_config!r})" if dataset_config else "")
        try:
            dataset = datasets.load_dataset(dataset_id, dataset_config, split=split)
        except ValueError as err:
            if "split" in str(err).lower():
                raise MissingSplitError(f"split {split!r} not found in {origin}: {err}") from err
            raise
    if len(dataset) == 0:
        raise DataError(f"{origin}: split {split!r} is empty")
    return dataset, origin


def has_split(split: str, data_files: Mapping[str, str | Sequence[str]] | None, dataset_id: str | None,
              dataset_config: str | None, seed: int = 0) -> bool:
    """Whether the data has a split of this name (for a dataset id, as the hub or the local cache lists them)."""
    if data_files is not None:
        return split in data_files
    if dataset_id is None:
        return split in _builtin_dataset(seed)
    try:
        return split in datasets.get_dataset_split_names(dataset_id, dataset_config)
    except Exception:  # noqa: BLE001 - unknown: loading the split will say why
        return True


def first_row(split: str, data_files: Mapping[str, str | Sequence[str]] | None, dataset_id: str | None,
              dataset_config: str | None) -> tuple[dict[str, Any], str]:
    """The columns and first row of a split (``split``, else the first of ``data_files``), read without loading it
    all: ``(row, origin)``.

    Raises:
        DataError: as :func:`load_split`, or for a split without rows.
    """
    if data_files is not None and split not in data_files and data_files:
        split = next(iter(data_files))
    if data_files is None:
        origin = f"dataset {dataset_id!r}"
        try:
            stream = datasets.load_dataset(dataset_id, dataset_config, split=split, streaming=True)
            return next(iter(stream)), origin
        except StopIteration as err:
            raise DataError(f"{origin}: split {split!r} is empty") from err
        except Exception as err:  # noqa: BLE001 - offline, unknown id, no such split: said in one line
            raise DataError(f"{origin}: cannot read the first row of split {split!r} to find its format "
                            f"({type(err).__name__}: {err}); check the id, or name data.task") from err
    dataset, origin = load_split(split, data_files, None, None)
    return dataset[0], origin
