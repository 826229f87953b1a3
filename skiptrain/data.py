"""Data loading, tokenisation and collation for skiptrain.

Batch layout (the convention the rest of the package relies on): every batch is LEFT-padded so that each row's
prompt ends at the same column ``P`` (``prompt_length``, the longest prompt in the batch); columns ``>= P`` hold
the target tokens, right-padded to the longest target ``T``. Column ``P + g`` holds the ``g``-th target token of
every row. Plain language-model data has no prompt (``P == 0``).

Labels follow the Hugging Face convention: ``labels`` is aligned with ``input_ids`` (``labels[:, c] ==
input_ids[:, c]`` on supervised positions, ``-100`` elsewhere) and the model/loss shifts internally, i.e. the logits
at column ``c - 1`` are scored against ``labels[:, c]``. With this layout the first target token (column ``P``) is
predicted from the last prompt token (column ``P - 1``).

Example::

    dm = SkipDataModule(task="e2e_nlg", tokenizer="gpt2", data_files={"train": "train.csv", "validation": "dev.csv"})
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import datasets
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from skiptrain.builtin_task import build_builtin_dataset
from skiptrain.models import load_tokenizer, prepare_tokenizer

IGNORE_INDEX = -100
SOURCE = "source"
TARGET = "target"
REFERENCES = "references"
PROMPT_IDS = "prompt_ids"
TARGET_IDS = "target_ids"
SOURCE_PLACEHOLDER = "{source}"

MetricKind = Literal["rouge", "bleu"]

SUMMARY_TEMPLATE = "Summarize the article.\n\nArticle: {source}\n\nSummary:"
XSUM_TEMPLATE = "Summarize the article in one sentence.\n\nArticle: {source}\n\nSummary:"
E2E_TEMPLATE = "Describe the restaurant in one sentence.\nAttributes: {source}\nSentence:"
BUILTIN_TEMPLATE = "Write the weather forecast.\nData: {source}\nForecast:"


@dataclass(frozen=True)
class TaskSpec:
    """Everything skiptrain knows about one task.

    Attributes:
        name: Task name (key of :data:`TASKS`).
        dataset_id: Default Hugging Face dataset id (``None`` for the generated ``builtin`` task).
        dataset_config: Default dataset config name.
        source_column: Default column holding the source text (the document text for ``text``).
        target_column: Default target column; ``None`` for plain language modelling.
        prompt_template: Default prompt; a format string with one ``{source}`` placeholder.
        metric: ``"rouge"``, ``"bleu"`` or ``None`` (perplexity only).
        train_split: Default training split name.
        val_split: Default validation split name.
        test_split: Default test split name.
        multi_reference: Evaluation splits are grouped by source, collecting all references (E2E style).
        column_aliases: Alternative ``(source, target)`` column pairs tried when the defaults are absent and the
            user did not name columns (e.g. the official E2E CSVs use ``mr``/``ref``).
    """

    name: str
    dataset_id: str | None
    dataset_config: str | None
    source_column: str
    target_column: str | None
    prompt_template: str | None
    metric: MetricKind | None
    train_split: str = "train"
    val_split: str = "validation"
    test_split: str = "test"
    multi_reference: bool = False
    column_aliases: tuple[tuple[str, str], ...] = ()

    @property
    def is_language_modeling(self) -> bool:
        """True for plain LM data (no target column, blocks of tokens, ``P == 0``)."""
        return self.target_column is None


TASKS: dict[str, TaskSpec] = {
    "cnn_dailymail": TaskSpec(
        name="cnn_dailymail",
        dataset_id="abisee/cnn_dailymail",
        dataset_config="3.0.0",
        source_column="article",
        target_column="highlights",
        prompt_template=SUMMARY_TEMPLATE,
        metric="rouge",
    ),
    "xsum": TaskSpec(
        name="xsum",
        dataset_id="EdinburghNLP/xsum",
        dataset_config=None,
        source_column="document",
        target_column="summary",
        prompt_template=XSUM_TEMPLATE,
        metric="rouge",
    ),
    # trl-lib/tldr is the OpenAI-filtered Reddit TL;DR set (Stiennon et al. 2020) in prompt/completion form. Its
    # prompts are already formatted ("SUBREDDIT: ... TITLE: ... POST: ... TL;DR:"), so the template is identity.
    # (CarperAI/openai_summarize_tldr holds the same data with columns prompt/label.)
    "reddit_tldr": TaskSpec(
        name="reddit_tldr",
        dataset_id="trl-lib/tldr",
        dataset_config=None,
        source_column="prompt",
        target_column="completion",
        prompt_template=SOURCE_PLACEHOLDER,
        metric="rouge",
        column_aliases=(("prompt", "label"),),
    ),
    "e2e_nlg": TaskSpec(
        name="e2e_nlg",
        dataset_id="tuetschek/e2e_nlg",
        dataset_config=None,
        source_column="meaning_representation",
        target_column="human_reference",
        prompt_template=E2E_TEMPLATE,
        metric="bleu",
        multi_reference=True,
        column_aliases=(("mr", "ref"), ("MR", "ref")),
    ),
    "text": TaskSpec(
        name="text",
        dataset_id="Salesforce/wikitext",
        dataset_config="wikitext-2-raw-v1",
        source_column="text",
        target_column=None,
        prompt_template=None,
        metric=None,
    ),
    "builtin": TaskSpec(
        name="builtin",
        dataset_id=None,
        dataset_config=None,
        source_column="mr",
        target_column="ref",
        prompt_template=BUILTIN_TEMPLATE,
        metric="bleu",
        multi_reference=True,
    ),
}

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


# --------------------------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------------------------


def get_task_spec(task: str) -> TaskSpec:
    """Look up a task.

    Args:
        task: Task name.

    Returns:
        The task's :class:`TaskSpec`.

    Raises:
        ValueError: If ``task`` is unknown (the message names the field, the value and the allowed values).
    """
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not supported; allowed values: {sorted(TASKS)}")
    return TASKS[task]


def validate_template(template: str) -> str:
    """Check that a prompt template has exactly one ``{source}`` placeholder.

    Args:
        template: The template.

    Returns:
        The template, unchanged.

    Raises:
        ValueError: If the placeholder is missing or repeated.
    """
    count = template.count(SOURCE_PLACEHOLDER)
    if count != 1:
        raise ValueError(
            f"prompt_template must contain '{SOURCE_PLACEHOLDER}' exactly once, found {count}: {template!r}"
        )
    return template


def fill_template(template: str, source: str) -> str:
    """Insert ``source`` into ``template`` (plain replacement, so other braces in the template are literal)."""
    return template.replace(SOURCE_PLACEHOLDER, source, 1)


def target_text(prompt: str, target: str) -> str:
    """Text appended after ``prompt``: the stripped target, preceded by a space unless the prompt ends in whitespace.

    Args:
        prompt: The filled prompt.
        target: The raw target.

    Returns:
        The target text as it follows the prompt in the training sequence.
    """
    target = target.strip()
    if prompt and not prompt[-1].isspace():
        return " " + target
    return target


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
            raise ValueError(
                f"data file {str(path)!r} has unsupported extension {suffix!r}; supported: {sorted(FILE_BUILDERS)}"
            )
        choices[suffix] = FILE_BUILDERS[suffix]
    if len({(b, tuple(sorted(kw.items()))) for b, kw in choices.values()}) != 1:
        raise ValueError(f"data files {path_list} mix formats {sorted(choices)}; use one format per split")
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
    raise ValueError(
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


def special_token_counts(tokenizer: Any) -> tuple[int, int]:
    """How many special tokens the tokenizer adds before and after the text with ``add_special_tokens=True``.

    Args:
        tokenizer: A Hugging Face tokenizer.

    Returns:
        ``(n_prefix, n_suffix)``, e.g. ``(1, 0)`` for Llama-style BOS, ``(0, 0)`` for GPT-2.
    """
    plain = tokenizer("a b", add_special_tokens=False)["input_ids"]
    full = tokenizer("a b", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return start, len(full) - start - len(plain)
    return 0, 0


def _strip_suffix(ids: list[int], n_suffix: int) -> list[int]:
    return ids[: len(ids) - n_suffix] if n_suffix else ids


def _truncate_source(
    tokenizer: Any, template: str, source: str, max_source_tokens: int, n_suffix: int
) -> tuple[str, list[int]]:
    """Filled prompt (text, ids) with ``source`` cut at a token boundary so it fits ``max_source_tokens``."""
    enc = tokenizer(source, add_special_tokens=False, return_offsets_mapping=bool(tokenizer.is_fast))
    src_ids = enc["input_ids"]
    offsets = enc.get("offset_mapping")
    overhead = len(_strip_suffix(tokenizer(fill_template(template, ""))["input_ids"], n_suffix))
    budget = min(len(src_ids), max_source_tokens - overhead)
    while budget > 0:
        cut = source[: offsets[budget - 1][1]] if offsets else tokenizer.decode(src_ids[:budget])
        text = fill_template(template, cut.rstrip())
        ids = _strip_suffix(tokenizer(text)["input_ids"], n_suffix)
        if len(ids) <= max_source_tokens:
            return text, ids
        budget -= max(1, len(ids) - max_source_tokens)
    text = fill_template(template, "")
    return text, _strip_suffix(tokenizer(text)["input_ids"], n_suffix)


def encode_prompts(
    tokenizer: Any, template: str, sources: Sequence[str], max_source_tokens: int
) -> tuple[list[str], list[list[int]]]:
    """Fill and tokenise prompts, trimming the SOURCE (never the template) to fit ``max_source_tokens``.

    Args:
        tokenizer: A Hugging Face tokenizer (special tokens such as BOS are kept; a trailing EOS is removed).
        template: Prompt template with one ``{source}``.
        sources: Source texts.
        max_source_tokens: Maximum prompt length in tokens, template and special tokens included.

    Returns:
        ``(prompt_texts, prompt_ids)``; ``prompt_texts`` hold the (possibly trimmed) filled templates.

    Raises:
        ValueError: If the template alone does not fit in ``max_source_tokens``.
    """
    _, n_suffix = special_token_counts(tokenizer)
    overhead = len(_strip_suffix(tokenizer(fill_template(template, ""))["input_ids"], n_suffix))
    if overhead >= max_source_tokens:
        raise ValueError(
            f"max_source_tokens={max_source_tokens} leaves no room for the source: the prompt template alone "
            f"takes {overhead} tokens ({template!r})"
        )
    texts = [fill_template(template, s) for s in sources]
    ids = [_strip_suffix(x, n_suffix) for x in tokenizer(texts)["input_ids"]]
    for i, row in enumerate(ids):
        if len(row) > max_source_tokens:
            texts[i], ids[i] = _truncate_source(tokenizer, template, sources[i], max_source_tokens, n_suffix)
    return texts, ids


def encode_pairs(
    tokenizer: Any,
    template: str,
    sources: Sequence[str],
    targets: Sequence[str],
    max_source_tokens: int,
    max_target_tokens: int,
) -> tuple[list[list[int]], list[list[int]]]:
    """Tokenise (source, target) pairs into prompt ids and target ids.

    The target is tokenised in context (``prompt + target`` minus the prompt's tokens, falling back to a separate
    encoding when the boundary merges), cut to ``max_target_tokens`` and followed by EOS. Only the source is ever
    trimmed; see :func:`encode_prompts`.

    Args:
        tokenizer: A Hugging Face tokenizer with an EOS token.
        template: Prompt template with one ``{source}``.
        sources: Source texts.
        targets: Target texts.
        max_source_tokens: Maximum prompt length in tokens.
        max_target_tokens: Maximum target length in tokens, before the EOS token.

    Returns:
        ``(prompt_ids, target_ids)``; each target ends with ``tokenizer.eos_token_id``.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token; targets must end with EOS")
    _, n_suffix = special_token_counts(tokenizer)
    prompt_texts, prompt_ids = encode_prompts(tokenizer, template, sources, max_source_tokens)
    continuations = [target_text(p, t) for p, t in zip(prompt_texts, targets, strict=True)]
    full_ids = tokenizer([p + c for p, c in zip(prompt_texts, continuations, strict=True)])["input_ids"]
    target_ids = []
    for p_ids, f_ids, cont in zip(prompt_ids, full_ids, continuations, strict=True):
        f_ids = _strip_suffix(f_ids, n_suffix)
        if f_ids[: len(p_ids)] == p_ids:
            t_ids = f_ids[len(p_ids) :]
        else:
            t_ids = tokenizer(cont, add_special_tokens=False)["input_ids"]
        target_ids.append(list(t_ids[:max_target_tokens]) + [eos])
    return prompt_ids, target_ids


def group_into_blocks(token_lists: Iterable[Sequence[int]], block_size: int, min_tail: int = 2) -> list[list[int]]:
    """Concatenate documents and cut the stream into blocks of ``block_size`` tokens.

    Args:
        token_lists: Token ids of consecutive documents.
        block_size: Block length.
        min_tail: The final partial block is kept if it has at least this many tokens (it is right-padded at
            collation), so small evaluation files lose no tokens.

    Returns:
        The blocks.
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    stream = [t for ids in token_lists for t in ids]
    blocks = [stream[i : i + block_size] for i in range(0, len(stream), block_size)]
    if blocks and len(blocks[-1]) < max(min_tail, 1):
        blocks.pop()
    return blocks


def collate(examples: Sequence[Mapping[str, Any]], pad_token_id: int, prompt_loss: bool = False) -> dict[str, Any]:
    """Collate tokenised examples into a left/right padded batch.

    Each example has ``prompt_ids`` and ``target_ids`` (lists of ints) and optionally ``source`` (str) and
    ``references`` (list of str). Row ``i`` of ``input_ids`` is ``[pad..., prompt..., target..., pad...]`` with
    the prompt ending at column ``P = max prompt length`` and the target starting at column ``P``.

    Args:
        examples: The examples.
        pad_token_id: Id used for padding (may equal EOS: labels and masks never depend on the pad id).
        prompt_loss: Also put labels on prompt tokens (pads never get labels).

    Returns:
        A dict with
        ``input_ids`` (LongTensor ``[B, P + T]``),
        ``attention_mask`` (``[B, P + T]``, 0 on pads),
        ``labels`` (``[B, P + T]``, aligned with ``input_ids`` and ``-100`` except on target tokens, plus prompt
        tokens with ``prompt_loss``; the model shifts, so logits at column ``c - 1`` predict ``labels[:, c]``),
        ``position_ids`` (``[B, P + T]``, ``cumsum(attention_mask) - 1`` clamped at 0, so left pads do not shift
        positions),
        ``prompt_length`` (int ``P``),
        ``prompt_input_ids`` / ``prompt_attention_mask`` (``[B, P]``, the left-padded prompts alone, for
        generation),
        and, when the examples carry them, ``sources`` (list of str) and ``references`` (list of list of str).
    """
    if not examples:
        raise ValueError("cannot collate an empty list of examples")
    prompts = [list(ex[PROMPT_IDS]) for ex in examples]
    targets = [list(ex[TARGET_IDS]) for ex in examples]
    batch_size = len(examples)
    prompt_len = max(len(p) for p in prompts)
    target_len = max(len(t) for t in targets)
    input_ids = torch.full((batch_size, prompt_len + target_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for i, (prompt, target) in enumerate(zip(prompts, targets, strict=True)):
        start = prompt_len - len(prompt)
        if prompt:
            input_ids[i, start:prompt_len] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[i, start:prompt_len] = 1
            if prompt_loss:
                labels[i, start:prompt_len] = input_ids[i, start:prompt_len]
        end = prompt_len + len(target)
        if target:
            input_ids[i, prompt_len:end] = torch.tensor(target, dtype=torch.long)
            attention_mask[i, prompt_len:end] = 1
            labels[i, prompt_len:end] = input_ids[i, prompt_len:end]
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "prompt_length": prompt_len,
        "prompt_input_ids": input_ids[:, :prompt_len].clone(),
        "prompt_attention_mask": attention_mask[:, :prompt_len].clone(),
    }
    if all(SOURCE in ex for ex in examples):
        batch["sources"] = [str(ex[SOURCE]) for ex in examples]
    if all(REFERENCES in ex for ex in examples):
        batch["references"] = [list(ex[REFERENCES]) for ex in examples]
    return batch


@dataclass(frozen=True)
class Collator:
    """Picklable wrapper around :func:`collate` for ``DataLoader(collate_fn=...)``.

    Attributes:
        pad_token_id: Padding id.
        prompt_loss: Also supervise prompt tokens.
    """

    pad_token_id: int
    prompt_loss: bool = False

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate ``examples``; see :func:`collate`."""
        return collate(examples, self.pad_token_id, self.prompt_loss)


# --------------------------------------------------------------------------------------------------------------
# Dataset-level steps (thin wrappers over datasets.Dataset methods)
# --------------------------------------------------------------------------------------------------------------


def _normalise_batch(batch: dict[str, list[Any]], src: str, tgt: str | None, strip: bool) -> dict[str, list[str]]:
    def as_text(value: Any) -> str:
        if value is None:
            return ""
        return str(value).strip() if strip else str(value)

    out = {SOURCE: [as_text(v) for v in batch[src]]}
    if tgt is not None:
        out[TARGET] = [as_text(v) for v in batch[tgt]]
    return out


def normalise_columns(
    dataset: datasets.Dataset, src: str, tgt: str | None, origin: str, split: str
) -> datasets.Dataset:
    """Map a raw split to canonical ``source``(/``target``) string columns and drop empty rows (logged).

    Args:
        dataset: The raw split.
        src: Source column.
        tgt: Target column, or ``None`` for language modelling (only exactly-empty rows are dropped there;
            whitespace such as blank lines is kept because it is part of the text stream).
        origin: Where the data came from, for messages.
        split: Split name, for messages.

    Returns:
        A dataset with columns ``source`` (and ``target``).

    Raises:
        ValueError: If no rows are left.
    """
    lm = tgt is None
    dataset = dataset.map(
        _normalise_batch,
        batched=True,
        fn_kwargs={"src": src, "tgt": tgt, "strip": not lm},
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
        raise ValueError(f"{origin}: split {split!r} has no usable rows (all {before} rows had empty text)")
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
    batch: dict[str, list[Any]], tokenizer: Any, template: str, max_source_tokens: int, max_target_tokens: int
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
    template: str,
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
            raise KeyError(f"split {split!r} not in data_files (available: {sorted(data_files)})")
        paths = data_files[split]
        path_list = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
        for path in path_list:
            if not any(ch in str(path) for ch in "*?[") and not Path(path).exists():
                raise FileNotFoundError(f"data_files[{split!r}]: {path} does not exist")
        origin = str(paths) if len(path_list) != 1 else str(path_list[0])
        builder, kwargs = infer_builder([str(p) for p in path_list])
        try:
            dataset = datasets.load_dataset(
                builder, data_files={split: [str(p) for p in path_list]}, split=split, **kwargs
            )
        except (datasets.exceptions.DatasetGenerationError, ValueError, StopIteration) as err:
            raise ValueError(
                f"{origin}: split {split!r} is empty or could not be read as {builder} ({type(err).__name__}: {err})"
            ) from err
    elif dataset_id is None:
        origin = "builtin weather task"
        dsd = _builtin_dataset(seed)
        if split not in dsd:
            raise KeyError(f"split {split!r} not in {origin} (available: {sorted(dsd)})")
        dataset = dsd[split]
    else:
        origin = f"dataset {dataset_id!r}" + (f" (config {dataset_config!r})" if dataset_config else "")
        try:
            dataset = datasets.load_dataset(dataset_id, dataset_config, split=split)
        except ValueError as err:
            if "split" in str(err).lower():
                raise KeyError(f"split {split!r} not found in {origin}: {err}") from err
            raise
    if len(dataset) == 0:
        raise ValueError(f"{origin}: split {split!r} is empty")
    return dataset, origin


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

    Batches are dicts produced by :func:`collate`: ``input_ids``, ``attention_mask``, ``labels``, ``position_ids``,
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
            prompt_template: Prompt with one ``{source}`` placeholder; ``None`` = task default.
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
        self.spec = get_task_spec(task)
        for name, value in (
            ("max_source_tokens", max_source_tokens),
            ("max_target_tokens", max_target_tokens),
            ("block_size", block_size),
            ("batch_size", batch_size),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        template = prompt_template if prompt_template is not None else self.spec.prompt_template
        self.prompt_template = None if self.spec.is_language_modeling else validate_template(template or "")
        self.tokenizer_name = tokenizer
        self.data_files = dict(data_files) if data_files is not None else None
        self.dataset_id = dataset_id or self.spec.dataset_id
        self.dataset_config = dataset_config if dataset_config is not None else self.spec.dataset_config
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
            "train": train_split or self.spec.train_split,
            "val": val_split or self.spec.val_split,
            "test": test_split or self.spec.test_split,
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
        return self.spec.name

    @property
    def task_spec(self) -> TaskSpec:
        """The task's :class:`TaskSpec`."""
        return self.spec

    @property
    def metric(self) -> MetricKind | None:
        """Generation metric for this task: ``"rouge"``, ``"bleu"`` or ``None`` (perplexity only)."""
        return self.spec.metric

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

    def _loader(self, dataset: datasets.Dataset, batch_size: int, shuffle: bool = False, **kwargs: Any) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            collate_fn=self.collator(),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            **kwargs,
        )

    def _build(self, role: Role) -> datasets.Dataset:
        split = self.split_names[role]
        raw, origin = load_split(split, self.data_files, self.dataset_id, self.dataset_config, seed=self.seed)
        src, tgt = resolve_columns(
            raw.column_names, self.spec, f"{origin} split {split!r}", self.source_column, self.target_column
        )
        data = normalise_columns(raw, src, tgt, origin, split)
        tokenizer = self.tokenizer
        if self.spec.is_language_modeling:
            data = tokenize_blocks(data, tokenizer, self.block_size)
            if len(data) == 0:
                raise ValueError(f"{origin}: split {split!r} produced no token blocks")
            limit = self.max_train_samples if role == "train" else self.max_eval_samples
            return self._subsample(data, limit, random=role == "train")
        if role == "train":
            data = self._subsample(data, self.max_train_samples, random=True)
            return tokenize_pairs(
                data, tokenizer, self.prompt_template, self.max_source_tokens, self.max_target_tokens, keep_text=False
            )
        if self.spec.multi_reference:
            data = group_dataset_references(data)
        data = self._subsample(data, self.max_eval_samples, random=False)
        return tokenize_pairs(
            data, tokenizer, self.prompt_template, self.max_source_tokens, self.max_target_tokens, keep_text=True
        )

    def _subsample(self, data: datasets.Dataset, limit: int | None, random: bool) -> datasets.Dataset:
        if limit is None or limit >= len(data):
            return data
        if random:
            data = data.shuffle(seed=self.seed)
        return data.select(range(limit))


__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "Collator",
    "SkipDataModule",
    "TaskSpec",
    "collate",
    "encode_pairs",
    "encode_prompts",
    "fill_template",
    "get_task_spec",
    "group_dataset_references",
    "group_into_blocks",
    "group_references",
    "infer_builder",
    "load_split",
    "resolve_columns",
    "special_token_counts",
    "target_text",
    "validate_template",
]
