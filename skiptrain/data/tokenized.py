"""Tokenising a split with ``datasets.map``: prompt/target pairs, or plain text cut into blocks
(:mod:`skiptrain.text.encoding` does the tokenising itself)."""

from __future__ import annotations

from typing import Any

import datasets

from skiptrain.data.columns import TARGET
from skiptrain.shipped.prompt_format import PromptFormat
from skiptrain.text.batch import PROMPT_IDS, REFERENCES, SOURCE, TARGET_IDS
from skiptrain.text.encoding import encode_pairs, group_into_blocks


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
