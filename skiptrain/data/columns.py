"""Mapping a split's columns to the canonical ``source``/``target`` (and ``references``) of every task."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
from lightning.pytorch.utilities import rank_zero_info

from skiptrain.errors import DataError
from skiptrain.text.batch import REFERENCES, SOURCE
from skiptrain.text.tasks import TaskSpec

TARGET = "target"


def resolve_columns(
    found: Sequence[str],
    spec: TaskSpec,
    origin: str,
    source_column: str | None = None,
    target_column: str | None = None,
) -> tuple[str, str | None]:
    """Decide which columns hold the source and target.

    Explicit names must exist. Otherwise the task defaults are used, then the task's ``column_aliases``.

    Args:
        found: Column names of the loaded split.
        spec: The task.
        origin: Description of where the data came from (file path or dataset id), for error messages.
        source_column: User-chosen source column, or ``None`` for the task default.
        target_column: User-chosen target column, or ``None`` for the task default.

    Returns:
        ``(source_column, target_column)``; the target is ``None`` for language modelling.

    Raises:
        ValueError: Naming ``origin``, the missing column and the columns found.
    """
    found = list(found)
    lm = spec.is_language_modeling
    src = source_column or spec.source_column
    tgt = None if lm else (target_column or spec.target_column)
    wanted = [c for c in (src, tgt) if c is not None]
    if all(c in found for c in wanted):
        return src, tgt
    if source_column is None and target_column is None and not lm:
        for alias_src, alias_tgt in spec.column_aliases:
            if alias_src in found and alias_tgt in found:
                rank_zero_info(f"{origin}: using columns {alias_src!r} -> {alias_tgt!r} for task {spec.name!r}")
                return alias_src, alias_tgt
    missing = [c for c in wanted if c not in found]
    raise DataError(
        f"{origin}: missing column(s) {missing} for task {spec.name!r}; columns found: {found}. "
        "Set source_column/target_column to map your columns."
    )


def group_references(sources: Sequence[str], targets: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Group (source, reference) pairs by source, for multi-reference evaluation (E2E).

    Args:
        sources: Source of each row (e.g. the E2E meaning representation).
        targets: Reference of each row.

    Returns:
        ``(unique_sources, references)``: sources in order of first appearance, and for each one all of its
        references in row order.
    """
    if len(sources) != len(targets):
        raise ValueError(f"got {len(sources)} sources but {len(targets)} targets")
    grouped: dict[str, list[str]] = {}
    for source, target in zip(sources, targets, strict=True):
        grouped.setdefault(source, []).append(target)
    return list(grouped), list(grouped.values())



def resolve_field_columns(found: Sequence[str], fields: Sequence[str], origin: str, source: str | None
                          ) -> dict[str, str]:
    """The data column of each template field: ``source`` for ``{source}``, the column of that name otherwise.

    Raises:
        DataError: naming ``origin``, every field whose column is missing, and the columns found.
    """
    columns = {name: source if name == SOURCE and source else name for name in fields}
    missing = [name for name, column in columns.items() if column not in found]
    if missing:
        raise DataError(f"{origin}: the prompt template names column(s) {missing} that the data lacks; columns found: "
                        f"{list(found)}. Name existing columns in data.prompt_template")
    return columns


def _normalise_batch(batch: dict[str, list[Any]], src: str, tgt: str | None, strip: bool,
                     fields: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    def as_text(value: Any) -> str:
        if value is None:
            return ""
        return str(value).strip() if strip else str(value)

    if fields:  # a template of several fields: the source is their values, as a JSON object
        rows = range(len(batch[tgt]))
        out = {SOURCE: [json.dumps({name: as_text(batch[column][i]) for name, column in fields.items()},
                                   ensure_ascii=False) for i in rows]}
    else:
        out = {SOURCE: [as_text(v) for v in batch[src]]}
    if tgt is not None:
        out[TARGET] = [as_text(v) for v in batch[tgt]]
    return out


def normalise_columns(
    dataset: datasets.Dataset, src: str, tgt: str | None, origin: str, split: str,
    fields: Mapping[str, str] | None = None,
) -> datasets.Dataset:
    """Map a raw split to canonical ``source``(/``target``) string columns and drop empty rows (logged).

    Args:
        dataset: The raw split.
        src: Source column.
        tgt: Target column, or ``None`` for language modelling (only exactly-empty rows are dropped there;
            whitespace such as blank lines is kept because it is part of the text stream).
        origin: Where the data came from, for messages.
        split: Split name, for messages.
        fields: Template field -> data column, for a template of several fields: the source is then the JSON
            object of their values (what :meth:`~skiptrain.shipped.prompt_format.PromptFormat.values` reads).

    Returns:
        A dataset with columns ``source`` (and ``target``).

    Raises:
        ValueError: If no rows are left.
    """
    lm = tgt is None
    dataset = dataset.map(
        _normalise_batch,
        batched=True,
        fn_kwargs={"src": src, "tgt": tgt, "strip": not lm, "fields": dict(fields or {})},
        remove_columns=dataset.column_names,
        desc=f"normalise {split}",
    )
    before = len(dataset)
    keep_cols = [SOURCE] if lm else [SOURCE, TARGET]
    dataset = dataset.filter(
        lambda batch: [all(batch[c][i] for c in keep_cols) for i in range(len(batch[SOURCE]))],
        batched=True,
        desc=f"drop empty rows in {split}",
    )
    dropped = before - len(dataset)
    if dropped:
        rank_zero_info(f"{origin} split {split!r}: dropped {dropped} of {before} rows with empty source or target")
    if len(dataset) == 0:
        raise DataError(f"{origin}: split {split!r} has no usable rows (all {before} rows had empty text)")
    return dataset


def group_dataset_references(dataset: datasets.Dataset) -> datasets.Dataset:
    """Dataset version of :func:`group_references`: one row per unique ``source``.

    Args:
        dataset: Columns ``source`` and ``target``.

    Returns:
        Columns ``source``, ``target`` (the first reference, used for the validation loss) and ``references``.
    """
    sources, refs = group_references(dataset[SOURCE], dataset[TARGET])
    return datasets.Dataset.from_dict({SOURCE: sources, TARGET: [r[0] for r in refs], REFERENCES: refs})
