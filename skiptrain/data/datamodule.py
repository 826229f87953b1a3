"""The LightningDataModule: a task's splits, loaded, mapped, tokenised and batched.

Splits are loaded (:func:`~skiptrain.data.loading.load_split`), mapped to canonical ``source``/``target`` columns
(:mod:`skiptrain.data.columns`), tokenised (:mod:`skiptrain.data.tokenized`) and batched by
:func:`skiptrain.text.batch.collate`, whose docstring states the batch layout every consumer relies on. Tasks are
described in :mod:`skiptrain.text.tasks`.

Example::

    dm = SkipDataModule(task="e2e_nlg", tokenizer="gpt2", data_files={"train": "train.csv", "validation": "dev.csv"})
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import datasets
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch.utils.data import DataLoader

from skiptrain.data.columns import (
    group_dataset_references,
    normalise_columns,
    resolve_columns,
    resolve_field_columns,
)
from skiptrain.data.formats import ROW, hold_out, read_examples, resolve_task
from skiptrain.data.loading import has_split, load_split
from skiptrain.data.options import Batching, Lengths, Role, Splits
from skiptrain.data.order import EpochShuffleSampler, ResumingLoader, TrainingPosition
from skiptrain.data.tokenized import tokenize_blocks, tokenize_pairs
from skiptrain.errors import DataError, UsageError
from skiptrain.modeling.loading import load_tokenizer, prepare_tokenizer
from skiptrain.shipped.prompt_format import PromptFormat, PromptFormatError
from skiptrain.text.batch import SOURCE, Collator
from skiptrain.text.tasks import AUTO, TASKS, MetricKind, TaskSpec, get_task_spec, validate_template

# --------------------------------------------------------------------------------------------------------------
# LightningDataModule
# --------------------------------------------------------------------------------------------------------------

def prompt_format_of(
    spec: TaskSpec, prompt_template: str | None, chat_template: bool | None = None, system_message: str | None = None,
    max_source_tokens: int | None = None,
) -> PromptFormat | None:
    """The prompt format of a task configured with these data options (``None`` for plain language modelling);
    ``chat_template=None`` is the task's default (the chat template for chat and instruction data).

    Raises:
        UsageError: naming the option, for a template without fields or with a repeated one, or a system message
            without the chat template.
    """
    if spec.is_language_modeling:
        return None
    template = validate_template(prompt_template if prompt_template is not None else spec.prompt_template or "")
    chat = spec.chat if chat_template is None else chat_template
    try:
        return PromptFormat(template, chat, system_message, max_source_tokens)
    except PromptFormatError as err:
        raise UsageError(str(err)) from err


def stored_prompt_format(data_hparams: Mapping[str, Any] | None) -> PromptFormat | None:
    """The prompt format of a run from its data module's stored hyperparameters (``None`` when unknown)."""
    if not data_hparams or data_hparams.get("task") not in TASKS:
        return None
    return prompt_format_of(get_task_spec(data_hparams["task"]), data_hparams.get("prompt_template"),
                            data_hparams.get("chat_template"), data_hparams.get("system_message"),
                            data_hparams.get("max_source_tokens"))

_STAGE_ROLES: dict[str | None, tuple[Role, ...]] = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("test",),
    None: ("train", "val", "test"),
}


class SkipDataModule(L.LightningDataModule):
    """Loads, tokenises and batches data for skiptrain (left-padded prompts ending at one column ``P``).

    Batches are dicts produced by :func:`~skiptrain.text.batch.collate`: ``input_ids``, ``attention_mask``, ``labels``,
    ``prompt_length``, ``prompt_input_ids``, ``prompt_attention_mask`` and, for evaluation batches of
    prompt/target tasks, ``sources`` and ``references``.
    """

    def __init__(
        self,
        task: str = AUTO,
        tokenizer: str | None = None,
        data_files: dict[str, str | list[str]] | None = None,
        dataset_id: str | None = None,
        dataset_config: str | None = None,
        source_column: str | None = None,
        target_column: str | None = None,
        prompt_template: str | None = None,
        chat_template: bool | None = None,
        system_message: str | None = None,
        max_source_tokens: int = 768,
        max_target_tokens: int = 128,
        block_size: int = 512,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        packing: bool = False,
        train_split: str | None = None,
        val_split: str | None = None,
        test_split: str | None = None,
        max_train_samples: int | None = None,
        max_eval_samples: int | None = None,
        val_share: float = 0.05,
        prompt_loss: bool = False,
        seed: int = 0,
    ) -> None:
        """Configure the data.

        Args:
            task: ``auto`` (the default: the format found from the columns of ``data_files`` or ``dataset_id``), a
                format: ``messages``, ``sharegpt``, ``alpaca``, ``prompt_completion``, ``text`` (plain language
                modelling) (see docs/data.md), or a task of the study: ``cnn_dailymail``, ``xsum``, ``reddit_tldr``,
                ``e2e_nlg``, ``builtin`` (generated weather data-to-text; no files, no network).
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
            chat_template: Make each prompt with the tokenizer's own ``apply_chat_template`` (a conversation's turns,
                or the filled template as the user message), the generation prompt last; targets are still the only
                labelled tokens. ``None`` = the task's default: on for chats and Alpaca rows, off otherwise.
            system_message: A system message before the user message (with ``chat_template``).
            max_source_tokens: Maximum prompt length in tokens; the source is trimmed, never the template.
            max_target_tokens: Maximum target tokens (EOS is appended after them).
            block_size: Tokens per training block for the ``text`` task.
            batch_size: Training batch size.
            eval_batch_size: Validation/test/predict batch size; ``None`` = ``batch_size``.
            num_workers: DataLoader worker processes.
            packing: Several examples in one row; refused, since it cannot keep the schedule exact (docs/data.md).
            train_split: Training split name; ``None`` = task default (``train``).
            val_split: Validation split name; ``None`` = task default (``validation``).
            test_split: Test split name, also used by ``predict_dataloader``; ``None`` = task default (``test``).
            max_train_samples: Keep a seeded random subset of this many training examples (blocks for ``text``).
            max_eval_samples: Keep the first this many evaluation examples (unique sources for E2E/builtin).
            val_share: Without a validation split, this seeded share of the training rows (whole conversations) is
                held out for validation; 0 holds out none.
            prompt_loss: Also compute the loss on prompt tokens.
            seed: Seed for shuffling, subsampling, the held-out rows and the builtin task.
        """
        super().__init__()
        self.save_hyperparameters()
        self.lengths = Lengths(max_source_tokens, max_target_tokens, block_size)
        self.batching = Batching(batch_size, eval_batch_size, num_workers, packing)
        task, chat_default = resolve_task(task, data_files, dataset_id, dataset_config, train_split,
                                          chat_template, prompt_template)  # ``auto`` reads the data's first row
        self.hparams.update(task=task, chat_template=chat_default if chat_template is None else chat_template)
        self.task_spec: TaskSpec = get_task_spec(task)
        self.splits = Splits.of(self.task_spec, train_split, val_split, test_split, max_train_samples,
                                max_eval_samples, val_share)
        self.prompt_format = prompt_format_of(self.task_spec, prompt_template, self.hparams.chat_template,
                                              system_message, max_source_tokens)
        self.tokenizer_name = tokenizer
        self.data_files = dict(data_files) if data_files is not None else None
        self.dataset_id = dataset_id or self.task_spec.dataset_id
        self.dataset_config = dataset_config if dataset_config is not None else self.task_spec.dataset_config
        self.columns = (source_column, target_column)
        self.prompt_loss, self.seed = prompt_loss, seed
        self._tokenizer: Any = None
        self.datasets: dict[Role, datasets.Dataset] = {}
        self._missing: set[Role] = set()
        self._read_splits: dict[str, tuple[datasets.Dataset, str]] = {}
        self._resume_at = TrainingPosition()
        self._train_loader_built = False

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
        self.prompt_format = dataclasses.replace(prompt_format, max_source_tokens=self.lengths.max_source_tokens)
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
        """Refuse length limits that let an example exceed the model's context length (``None``: no limit), and a
        prompt template that alone fills ``max_source_tokens`` (the tokenizer is loaded; no data is read).

        Raises:
            UsageError: naming the limits and the context length, or the template.
            ModelError: for a tokenizer that cannot be used.
        """
        if self.prompt_format is not None and (self._tokenizer is not None or self.tokenizer_name is not None):
            empty = {name: "" for name in self.prompt_format.fields}
            self.prompt_format.encode(self.tokenizer, [empty])  # the template fits (and a chat template exists)
        if context_length is None:
            return
        limits, longest = self.lengths.limit(self.task_spec.is_language_modeling)
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
        """Shuffled training batches: one seeded permutation per epoch (:mod:`skiptrain.data.order`); a run resumed
        mid-epoch continues it with the batches the stopped run had not trained."""
        data = self._get("train", "fit")
        at, self._resume_at = self._resume_at, TrainingPosition()
        self._train_loader_built = True
        return self._loader(data, self.batching.batch_size, sampler=EpochShuffleSampler(len(data), self.seed, at.epoch),
                            skip_batches=at.batches)

    def val_dataloader(self) -> DataLoader | list:
        """Validation batches; an empty list (Lightning skips validation) when there is no validation split."""
        if "val" in self._missing:
            return []
        return self._loader(self._get("val", "validate"), self.batching.eval_size)

    def test_dataloader(self) -> DataLoader:
        """Test batches."""
        return self._loader(self._get("test", "test"), self.batching.eval_size)

    def predict_dataloader(self) -> DataLoader:
        """Batches of the test split for generation."""
        return self._loader(self._get("test", "predict"), self.batching.eval_size)

    def state_dict(self) -> dict[str, Any]:
        """Saved in each checkpoint of a fit: its position (:class:`~skiptrain.data.order.TrainingPosition`)."""
        if self.trainer is None or not self.trainer.training:
            return {}
        return TrainingPosition.of(self.trainer).state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training order at the checkpoint's position (Lightning calls this before building the loaders,
        except under strategies that load checkpoints after their setup, FSDP and DeepSpeed)."""
        if not state_dict:
            return
        at = TrainingPosition.from_state_dict(state_dict)
        if at.batches and self._train_loader_built:
            rank_zero_warn(f"resuming epoch {at.epoch} after batch {at.batches}: this strategy loads checkpoints "
                           "after building the training batches, so the epoch's batch order starts again")
            return
        self._resume_at = at
        if not at.batches:  # an epoch boundary: the seeded order alone continues the run
            return
        rank_zero_info(f"skiptrain: resuming epoch {at.epoch} at batch {at.batches + 1}, after the {at.batches} "
                       "the stopped run trained")
        # Lightning cannot see that the position was restored here and would call the loader not resumable.
        warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch",
                                category=PossibleUserWarning)

    def collator(self) -> Collator:
        """The collate function used by the loaders."""
        return Collator(pad_token_id=self.tokenizer.pad_token_id, prompt_loss=self.prompt_loss)

    # ---- internals ---------------------------------------------------------------------------------------------

    def _get(self, role: Role, stage: str) -> datasets.Dataset:
        if role not in self.datasets:
            self.setup(stage)
        return self.datasets[role]

    def _loader(
        self, dataset: datasets.Dataset, batch_size: int, sampler: torch.utils.data.Sampler[int] | None = None,
        skip_batches: int = 0,
    ) -> DataLoader:
        return ResumingLoader(
            dataset,
            skip_batches=skip_batches,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=self.collator(),
            num_workers=self.batching.num_workers,
            persistent_workers=self.batching.num_workers > 0,
        )

    def _build(self, role: Role) -> datasets.Dataset:
        data, where = self._examples(role)
        tokenizer, lengths = self.tokenizer, self.lengths
        if self.task_spec.is_language_modeling:
            data = tokenize_blocks(data, tokenizer, lengths.block_size)
            if len(data) == 0:
                raise DataError(f"{where} produced no token blocks")
            limit = self.splits.max_train_samples if role == "train" else self.splits.max_eval_samples
            return self._subsample(data, limit, random=role == "train")
        if role == "train":
            data = self._subsample(data, self.splits.max_train_samples, random=True)
            return tokenize_pairs(data, tokenizer, self.prompt_format, lengths.max_source_tokens,
                                  lengths.max_target_tokens, keep_text=False)
        if self.task_spec.multi_reference:
            data = group_dataset_references(data)
        data = self._subsample(data, self.splits.max_eval_samples, random=False)
        return tokenize_pairs(data, tokenizer, self.prompt_format, lengths.max_source_tokens,
                              lengths.max_target_tokens, keep_text=True)

    def _examples(self, role: Role) -> tuple[datasets.Dataset, str]:
        """A split's examples (columns ``source`` and ``target``) and where they came from; without a validation
        split, the validation examples are a seeded share of the training rows, and training keeps the rest."""
        if role == "test" or not self.splits.val_share or has_split(
                self.splits.val, self.data_files, self.dataset_id, self.dataset_config, self.seed):
            data, where = self._read(self.splits.name(role))
            return _without_rows(data), where
        data, where = self._read(self.splits.train)
        parts = hold_out(data, self.splits.val_share, self.seed)
        if parts is None:
            if role == "val":
                raise KeyError(f"{where} has no split {self.splits.val!r} and too few rows to hold some out")
            return _without_rows(data), where
        kept, held, count, rows = parts
        if role == "train":
            return _without_rows(kept), where
        rank_zero_info(f"{where}: no split {self.splits.val!r}, so {count} of its {rows} rows ({len(held)} examples) "
                       f"are held out for validation (data.val_share={self.splits.val_share}, seed {self.seed})")
        return _without_rows(held), f"{where}, held out"

    def _read(self, split: str) -> tuple[datasets.Dataset, str]:
        """A raw split read into canonical ``source``/``target`` columns (and ``row`` for the named formats), once."""
        if split not in self._read_splits:
            self._read_splits[split] = self._read_once(split)
        return self._read_splits[split]

    def _read_once(self, split: str) -> tuple[datasets.Dataset, str]:
        raw, origin = load_split(split, self.data_files, self.dataset_id, self.dataset_config, seed=self.seed)
        where = f"{origin} split {split!r}"
        if self.task_spec.row_format is not None:
            return read_examples(raw, self.task_spec.row_format, where), where
        source_column, target_column = self.columns
        fields = self.prompt_format.fields if self.prompt_format is not None else (SOURCE,)
        if fields == (SOURCE,):
            src, tgt = resolve_columns(raw.column_names, self.task_spec, where, source_column, target_column)
            columns = None
        else:
            source = source_column or self.task_spec.source_column
            src, tgt = resolve_columns(raw.column_names, self.task_spec, where,
                                       source if SOURCE in fields else fields[0], target_column)
            columns = resolve_field_columns(raw.column_names, fields, where, src)
        data = normalise_columns(raw, src, tgt, origin, split, columns)
        if self.task_spec.is_language_modeling:
            rank_zero_info(f"{where}: text format, {len(data)} rows")
        return data, where

    def _subsample(self, data: datasets.Dataset, limit: int | None, random: bool) -> datasets.Dataset:
        if limit is None or limit >= len(data):
            return data
        if random:
            data = data.shuffle(seed=self.seed)
        return data.select(range(limit))


def _without_rows(data: datasets.Dataset) -> datasets.Dataset:
    """``data`` without the row numbers of the named formats."""
    return data.remove_columns(ROW) if ROW in data.column_names else data


__all__ = ["EpochShuffleSampler", "SkipDataModule", "prompt_format_of", "stored_prompt_format"]
