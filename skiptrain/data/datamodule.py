"""Loading data for skiptrain: raw splits from files, the hub or the builtin task, and the LightningDataModule.

Splits are loaded (:func:`load_split`), mapped to canonical ``source``/``target`` columns (:func:`resolve_columns`,
:func:`normalise_columns`), tokenised (:mod:`skiptrain.text.encoding`) and batched by
:func:`skiptrain.text.batch.collate`, whose docstring states the batch layout every consumer relies on. Tasks are
described in :mod:`skiptrain.text.tasks`.

Example::

    dm = SkipDataModule(task="e2e_nlg", tokenizer="gpt2", data_files={"train": "train.csv", "validation": "dev.csv"})
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import datasets
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from skiptrain.data.builtin_task import build_builtin_dataset
from skiptrain.errors import DataError, UsageError
from skiptrain.modeling.loading import load_tokenizer, prepare_tokenizer
from skiptrain.text.batch import PROMPT_IDS, REFERENCES, SOURCE, TARGET_IDS, Collator
from skiptrain.text.encoding import encode_pairs, group_into_blocks
from skiptrain.text.prompt_format import PromptFormat, PromptFormatError
from skiptrain.text.tasks import TASKS, MetricKind, TaskSpec, get_task_spec, validate_template


class MissingSplitError(DataError, KeyError):
    """A split the stage needs is not in the data files or the dataset (a ``KeyError`` too)."""

    __str__ = Exception.__str__  # the message, not KeyError's repr of it


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A local data file does not exist (a ``FileNotFoundError`` too)."""

    __str__ = Exception.__str__

TARGET = "target"

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


# --------------------------------------------------------------------------------------------------------------
# Dataset-level steps (thin wrappers over datasets.Dataset methods)
# --------------------------------------------------------------------------------------------------------------


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
            object of their values (what :meth:`~skiptrain.text.prompt_format.PromptFormat.values` reads).

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


def _tokenize_pairs_batch(
    batch: dict[str, list[Any]], tokenizer: Any, template: str | PromptFormat, max_source_tokens: int,
    max_target_tokens: int,
) -> dict[str, list[list[int]]]:
    prompt_ids, target_ids = encode_pairs(
        tokenizer, template, batch[SOURCE], batch[TARGET], max_source_tokens, max_target_tokens
    )
    return {PROMPT_IDS: prompt_ids, TARGET_IDS: target_ids}


def _tokenize_blocks_batch(batch: dict[str, list[Any]], tokenizer: Any, block_size: int) -> dict[str, list[list[int]]]:
    ids = tokenizer(batch[SOURCE], add_special_tokens=False)["input_ids"]
    blocks = group_into_blocks(ids, block_size)
    return {PROMPT_IDS: [[] for _ in blocks], TARGET_IDS: blocks}


def tokenize_pairs(
    dataset: datasets.Dataset,
    tokenizer: Any,
    template: str | PromptFormat,
    max_source_tokens: int,
    max_target_tokens: int,
    keep_text: bool,
) -> datasets.Dataset:
    """Tokenise a ``source``/``target`` dataset with ``Dataset.map`` (batched, so ``datasets`` caches it).

    Args:
        dataset: Columns ``source``, ``target`` (and optionally ``references``).
        tokenizer: The tokenizer.
        template: Prompt template.
        max_source_tokens: Maximum prompt tokens.
        max_target_tokens: Maximum target tokens before EOS.
        keep_text: Keep ``source`` and ``references`` (evaluation); otherwise only the id columns remain.

    Returns:
        The dataset with ``prompt_ids`` and ``target_ids`` (and ``references`` always present when ``keep_text``).
    """
    if keep_text and REFERENCES not in dataset.column_names:
        dataset = dataset.map(lambda b: {REFERENCES: [[t] for t in b[TARGET]]}, batched=True, desc="references")
    remove = [TARGET] if keep_text else dataset.column_names
    return dataset.map(
        _tokenize_pairs_batch,
        batched=True,
        fn_kwargs={
            "tokenizer": tokenizer,
            "template": template,
            "max_source_tokens": max_source_tokens,
            "max_target_tokens": max_target_tokens,
        },
        remove_columns=remove,
        desc="tokenize",
    )


def tokenize_blocks(dataset: datasets.Dataset, tokenizer: Any, block_size: int) -> datasets.Dataset:
    """Tokenise plain text and cut it into blocks (``prompt_ids`` empty, ``target_ids`` the block).

    Args:
        dataset: Column ``source`` with the text rows, in document order.
        tokenizer: The tokenizer.
        block_size: Tokens per block.

    Returns:
        The block dataset.
    """
    return dataset.map(
        _tokenize_blocks_batch,
        batched=True,
        batch_size=4096,
        fn_kwargs={"tokenizer": tokenizer, "block_size": block_size},
        remove_columns=dataset.column_names,
        desc=f"tokenize into blocks of {block_size}",
    )


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


def prompt_format_of(
    spec: TaskSpec, prompt_template: str | None, chat_template: bool = False, system_message: str | None = None,
    max_source_tokens: int | None = None,
) -> PromptFormat | None:
    """The prompt format of a task configured with these data options (``None`` for plain language modelling).

    Raises:
        UsageError: naming the option, for a template without fields or with a repeated one, or a system message
            without the chat template.
    """
    if spec.is_language_modeling:
        return None
    template = validate_template(prompt_template if prompt_template is not None else spec.prompt_template or "")
    try:
        return PromptFormat(template, chat_template, system_message, max_source_tokens)
    except PromptFormatError as err:
        raise UsageError(str(err)) from err


def stored_prompt_format(data_hparams: Mapping[str, Any] | None) -> PromptFormat | None:
    """The prompt format of a run from its data module's stored hyperparameters (``None`` when unknown)."""
    if not data_hparams or data_hparams.get("task") not in TASKS:
        return None
    return prompt_format_of(get_task_spec(data_hparams["task"]), data_hparams.get("prompt_template"),
                            bool(data_hparams.get("chat_template")), data_hparams.get("system_message"),
                            data_hparams.get("max_source_tokens"))


# --------------------------------------------------------------------------------------------------------------
# LightningDataModule
# --------------------------------------------------------------------------------------------------------------

Role = Literal["train", "val", "test"]
_STAGE_ROLES: dict[str | None, tuple[Role, ...]] = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("test",),
    None: ("train", "val", "test"),
}


class EpochShuffleSampler(torch.utils.data.Sampler[int]):
    """A permutation seeded by ``seed + epoch``.

    Lightning calls ``set_epoch`` before every epoch, so the order depends only on the epoch number: a run
    resumed from a checkpoint at an epoch boundary continues exactly as an uninterrupted one (under DDP
    Lightning swaps in a ``DistributedSampler``, which is seeded per epoch the same way).
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


class SkipDataModule(L.LightningDataModule):
    """Loads, tokenises and batches data for skiptrain (left-padded prompts ending at one column ``P``).

    Batches are dicts produced by :func:`~skiptrain.text.batch.collate`: ``input_ids``, ``attention_mask``, ``labels``,
    ``prompt_length``, ``prompt_input_ids``, ``prompt_attention_mask`` and, for evaluation batches of
    prompt/target tasks, ``sources`` and ``references``.
    """

    def __init__(
        self,
        task: str,
        tokenizer: str | None = None,
        data_files: dict[str, str | list[str]] | None = None,
        dataset_id: str | None = None,
        dataset_config: str | None = None,
        source_column: str | None = None,
        target_column: str | None = None,
        prompt_template: str | None = None,
        chat_template: bool = False,
        system_message: str | None = None,
        max_source_tokens: int = 768,
        max_target_tokens: int = 128,
        block_size: int = 512,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        train_split: str | None = None,
        val_split: str | None = None,
        test_split: str | None = None,
        max_train_samples: int | None = None,
        max_eval_samples: int | None = None,
        prompt_loss: bool = False,
        seed: int = 0,
    ) -> None:
        """Configure the data.

        Args:
            task: One of ``cnn_dailymail``, ``xsum``, ``reddit_tldr``, ``e2e_nlg``, ``text`` (plain language
                modelling) or ``builtin`` (generated weather data-to-text task; no files, no network).
            tokenizer: Tokenizer name or path, resolved like the model name it is usually linked from (hub id,
                local directory, ``.gguf`` file or bundled short name). A tokenizer object can be given instead with
                ``set_tokenizer``.
            data_files: Split name -> local file path(s) (csv, tsv, json, jsonl, parquet, txt/raw), loaded with
                ``datasets.load_dataset(<builder>, data_files=...)``. ``None`` loads the task's hub dataset.
            dataset_id: Hugging Face dataset id overriding the task default.
            dataset_config: Dataset config name overriding the task default.
            source_column: Column with the source (or the text for ``text``); ``None`` = task default.
            target_column: Column with the target; ``None`` = task default.
            prompt_template: Prompt with ``{source}`` (the source column) and/or ``{column}`` placeholders naming
                other data columns, each once; ``None`` = task default.
            chat_template: Make each prompt with the tokenizer's own ``apply_chat_template``: the filled template is
                the user message, the generation prompt follows; targets are still the only labelled tokens.
            system_message: A system message before the user message (with ``chat_template``).
            max_source_tokens: Maximum prompt length in tokens; the source is trimmed, never the template.
            max_target_tokens: Maximum target tokens (EOS is appended after them).
            block_size: Tokens per training block for the ``text`` task.
            batch_size: Training batch size.
            eval_batch_size: Validation/test/predict batch size; ``None`` = ``batch_size``.
            num_workers: DataLoader worker processes.
            train_split: Training split name; ``None`` = task default (``train``).
            val_split: Validation split name; ``None`` = task default (``validation``).
            test_split: Test split name, also used by ``predict_dataloader``; ``None`` = task default (``test``).
            max_train_samples: Keep a seeded random subset of this many training examples (blocks for ``text``).
            max_eval_samples: Keep the first this many evaluation examples (unique sources for E2E/builtin).
            prompt_loss: Also compute the loss on prompt tokens.
            seed: Seed for shuffling, subsampling and the builtin task.
        """
        super().__init__()
        self.task_spec: TaskSpec = get_task_spec(task)
        for name, value in (
            ("max_source_tokens", max_source_tokens),
            ("max_target_tokens", max_target_tokens),
            ("block_size", block_size),
            ("batch_size", batch_size),
        ):
            if value < 1:
                raise UsageError(f"{name} must be >= 1, got {value}")
        self.prompt_format = prompt_format_of(self.task_spec, prompt_template, chat_template, system_message,
                                              max_source_tokens)
        self.tokenizer_name = tokenizer
        self.data_files = dict(data_files) if data_files is not None else None
        self.dataset_id = dataset_id or self.task_spec.dataset_id
        self.dataset_config = dataset_config if dataset_config is not None else self.task_spec.dataset_config
        if task == "builtin" and dataset_id is None:
            self.dataset_id = None
        self.source_column = source_column
        self.target_column = target_column
        self.max_source_tokens = max_source_tokens
        self.max_target_tokens = max_target_tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.split_names: dict[Role, str] = {
            "train": train_split or self.task_spec.train_split,
            "val": val_split or self.task_spec.val_split,
            "test": test_split or self.task_spec.test_split,
        }
        self.max_train_samples = max_train_samples
        self.max_eval_samples = max_eval_samples
        self.prompt_loss = prompt_loss
        self.seed = seed
        self._tokenizer: Any = None
        self.datasets: dict[Role, datasets.Dataset] = {}
        self._missing: set[Role] = set()
        self.save_hyperparameters()

    # ---- public properties --------------------------------------------------------------------------------------

    @property
    def task(self) -> str:
        """Task name."""
        return self.task_spec.name

    @property
    def prompt_template(self) -> str | None:
        """The prompt template (``None`` for plain language modelling)."""
        return None if self.prompt_format is None else self.prompt_format.template

    def use_prompt_format(self, prompt_format: PromptFormat) -> None:
        """Make prompts with ``prompt_format`` (e.g. the one an export records); clears already tokenised splits."""
        self.prompt_format = dataclasses.replace(prompt_format, max_source_tokens=self.max_source_tokens)
        self.datasets = {}
        self._missing = set()

    @property
    def metric(self) -> MetricKind | None:
        """Generation metric for this task: ``"rouge"``, ``"bleu"`` or ``None`` (perplexity only)."""
        return self.task_spec.metric

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (loaded from ``tokenizer`` on first use)."""
        if self._tokenizer is None:
            if self.tokenizer_name is None:
                raise ValueError(
                    "no tokenizer: pass tokenizer=<name or path> or call set_tokenizer(tok) before setup()"
                )
            self._tokenizer = load_tokenizer(self.tokenizer_name)
        return self._tokenizer

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Use a tokenizer object (e.g. the model's); clears already tokenised splits.

        Args:
            tokenizer: A Hugging Face tokenizer; a missing pad token is set to EOS.
        """
        self._tokenizer = prepare_tokenizer(tokenizer)
        self.datasets = {}
        self._missing = set()

    def check_context(self, context_length: int | None) -> None:
        """Refuse length limits that let an example exceed the model's context length (``None``: no limit).

        Raises:
            UsageError: naming the limits and the context length.
        """
        if context_length is None:
            return
        if self.task_spec.is_language_modeling:
            limits, longest = f"block_size={self.block_size}", self.block_size
        else:
            longest = self.max_source_tokens + self.max_target_tokens + 1
            limits = (f"max_source_tokens={self.max_source_tokens} + max_target_tokens={self.max_target_tokens} "
                      "+ 1 (EOS)")
        if longest > context_length:
            raise UsageError(f"{limits} = {longest} tokens exceeds the model's context length of {context_length} "
                             "tokens: lower them so that an example fits")

    # ---- Lightning hooks ----------------------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Download the hub dataset and tokenizer (no processing; runs on one process)."""
        if self.data_files is None and self.dataset_id is not None:
            datasets.load_dataset(self.dataset_id, self.dataset_config)
        if self.tokenizer_name is not None and self._tokenizer is None:
            load_tokenizer(self.tokenizer_name)

    def setup(self, stage: str | None = None) -> None:
        """Load and tokenise the splits a stage needs.

        ``fit``: train (+ val when present), ``validate``: val, ``test``/``predict``: test, ``None``: all available.

        Args:
            stage: Lightning stage.

        Raises:
            ValueError: For unknown stages, bad columns or empty splits.
            KeyError: If the training split (for ``fit``) or the test split (for ``test``/``predict``) is missing.
        """
        if stage not in _STAGE_ROLES:
            raise ValueError(f"stage={stage!r} is not supported; allowed values: {list(_STAGE_ROLES)}")
        for role in _STAGE_ROLES[stage]:
            if role in self.datasets or role in self._missing:
                continue
            try:
                self.datasets[role] = self._build(role)
            except KeyError as err:
                required = stage is not None and (role != "val" or stage == "validate")
                if required:
                    raise
                self._missing.add(role)
                rank_zero_warn(f"no {role} data: {err.args[0]}")

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches: one seeded permutation per epoch, so a resumed run sees the same order."""
        data = self._get("train", "fit")
        return self._loader(data, self.batch_size, sampler=EpochShuffleSampler(len(data), self.seed))

    def val_dataloader(self) -> DataLoader | list:
        """Validation batches; an empty list (Lightning skips validation) when there is no validation split."""
        if "val" in self._missing:
            return []
        return self._loader(self._get("val", "validate"), self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        """Test batches."""
        return self._loader(self._get("test", "test"), self.eval_batch_size)

    def predict_dataloader(self) -> DataLoader:
        """Batches of the test split for generation."""
        return self._loader(self._get("test", "predict"), self.eval_batch_size)

    def collator(self) -> Collator:
        """The collate function used by the loaders."""
        return Collator(pad_token_id=self.tokenizer.pad_token_id, prompt_loss=self.prompt_loss)

    # ---- internals ---------------------------------------------------------------------------------------------

    def _get(self, role: Role, stage: str) -> datasets.Dataset:
        if role not in self.datasets:
            self.setup(stage)
        return self.datasets[role]

    def _loader(
        self, dataset: datasets.Dataset, batch_size: int, sampler: torch.utils.data.Sampler[int] | None = None
    ) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=self.collator(),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _build(self, role: Role) -> datasets.Dataset:
        split = self.split_names[role]
        raw, origin = load_split(split, self.data_files, self.dataset_id, self.dataset_config, seed=self.seed)
        where = f"{origin} split {split!r}"
        fields = self.prompt_format.fields if self.prompt_format is not None else (SOURCE,)
        if fields == (SOURCE,):
            src, tgt = resolve_columns(raw.column_names, self.task_spec, where, self.source_column, self.target_column)
            columns = None
        else:
            source = self.source_column or self.task_spec.source_column
            src, tgt = resolve_columns(raw.column_names, self.task_spec, where,
                                       source if SOURCE in fields else fields[0], self.target_column)
            columns = resolve_field_columns(raw.column_names, fields, where, src)
        data = normalise_columns(raw, src, tgt, origin, split, columns)
        tokenizer = self.tokenizer
        if self.task_spec.is_language_modeling:
            data = tokenize_blocks(data, tokenizer, self.block_size)
            if len(data) == 0:
                raise DataError(f"{origin}: split {split!r} produced no token blocks")
            limit = self.max_train_samples if role == "train" else self.max_eval_samples
            return self._subsample(data, limit, random=role == "train")
        if role == "train":
            data = self._subsample(data, self.max_train_samples, random=True)
            return tokenize_pairs(
                data, tokenizer, self.prompt_format, self.max_source_tokens, self.max_target_tokens, keep_text=False
            )
        if self.task_spec.multi_reference:
            data = group_dataset_references(data)
        data = self._subsample(data, self.max_eval_samples, random=False)
        return tokenize_pairs(
            data, tokenizer, self.prompt_format, self.max_source_tokens, self.max_target_tokens, keep_text=True
        )

    def _subsample(self, data: datasets.Dataset, limit: int | None, random: bool) -> datasets.Dataset:
        if limit is None or limit >= len(data):
            return data
        if random:
            data = data.shuffle(seed=self.seed)
        return data.select(range(limit))


__all__ = [
    "EpochShuffleSampler",
    "SkipDataModule",
    "group_dataset_references",
    "group_references",
    "infer_builder",
    "load_split",
    "normalise_columns",
    "prompt_format_of",
    "resolve_columns",
    "resolve_field_columns",
    "stored_prompt_format",
    "tokenize_blocks",
    "tokenize_pairs",
]
