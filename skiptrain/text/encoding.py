"""Tokenisation of prompt/target pairs and of plain text (pure functions over a Hugging Face tokenizer).

Prompts are made by the run's :class:`~skiptrain.shipped.prompt_format.PromptFormat` (template fields, chat template,
special tokens; only the last field is ever trimmed to fit ``max_source_tokens``, never the template); targets are
tokenised in the context of their prompt and end with EOS. Plain text is cut into fixed-size blocks
(:func:`group_into_blocks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from skiptrain.errors import DataError
from skiptrain.shipped.prompt_format import PromptFormat, PromptSource, special_token_counts


def as_prompt_format(template: str | PromptFormat, max_source_tokens: int | None) -> PromptFormat:
    """``template`` as a prompt format (a string is a plain template) limited to ``max_source_tokens``."""
    if isinstance(template, PromptFormat):
        return dataclasses.replace(template, max_source_tokens=max_source_tokens)
    return PromptFormat(template, max_source_tokens=max_source_tokens)


def tokenize_prompts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of raw prompt texts: special tokens such as BOS kept, a trailing EOS removed, nothing trimmed.

    This is the plain (``{source}``) prompt format's rule, so raw inference prompts and training prompts of the
    same text give the same ids.
    """
    return PromptFormat().tokenize(tokenizer, texts)


def encode_prompts(
    tokenizer: Any, template: str | PromptFormat, sources: Sequence[PromptSource], max_source_tokens: int
) -> tuple[list[str], list[list[int]]]:
    """Fill and tokenise prompts, trimming the source (never the template) to fit ``max_source_tokens``.

    Args:
        tokenizer: A Hugging Face tokenizer.
        template: A prompt template (``{source}`` or several ``{column}`` fields) or a whole prompt format.
        sources: Source texts (or objects of field values for a template of several fields).
        max_source_tokens: Maximum prompt length in tokens, template and special tokens included.

    Returns:
        ``(prompt_texts, prompt_ids)``; ``prompt_texts`` hold the (possibly trimmed) prompts.

    Raises:
        PromptFormatError: If the template alone does not fit in ``max_source_tokens``, or a source lacks a field.
    """
    return as_prompt_format(template, max_source_tokens).encode(tokenizer, sources)


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


def encode_pairs(
    tokenizer: Any,
    template: str | PromptFormat,
    sources: Sequence[PromptSource],
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
        template: Prompt template or prompt format (see :func:`encode_prompts`).
        sources: Source texts (or objects of field values).
        targets: Target texts.
        max_source_tokens: Maximum prompt length in tokens.
        max_target_tokens: Maximum target length in tokens, before the EOS token.

    Returns:
        ``(prompt_ids, target_ids)``; each target ends with ``tokenizer.eos_token_id``.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError("the tokenizer has no eos_token; targets must end with EOS")
    prompt_format = as_prompt_format(template, max_source_tokens)
    prompt_texts, prompt_ids = prompt_format.encode(tokenizer, sources)
    continuations = [target_text(p, t) for p, t in zip(prompt_texts, targets, strict=True)]
    full_ids = prompt_format.tokenize(tokenizer, [p + c for p, c in zip(prompt_texts, continuations, strict=True)])
    target_ids = []
    for p_ids, f_ids, cont in zip(prompt_ids, full_ids, continuations, strict=True):
        if f_ids[: len(p_ids)] == p_ids:
            t_ids = f_ids[len(p_ids) :]
        else:
            t_ids = tokenizer(cont, add_special_tokens=False)["input_ids"]
        target_ids.append(list(t_ids[:max_target_tokens]) + [eos])
    return prompt_ids, target_ids


def group_into_blocks(token_lists: Iterable[Sequence[int]], block_size: int) -> list[list[int]]:
    """Concatenate documents and cut the stream into blocks of ``block_size`` tokens.

    The final partial block is kept if it has at least two tokens (one prediction; it is right-padded at
    collation), so small evaluation files lose no tokens.

    Args:
        token_lists: Token ids of consecutive documents.
        block_size: Block length.

    Returns:
        The blocks.
    """
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2, got {block_size}")
    stream = [t for ids in token_lists for t in ids]
    blocks = [stream[i : i + block_size] for i in range(0, len(stream), block_size)]
    if blocks and len(blocks[-1]) < 2:
        blocks.pop()
    return blocks


__all__ = [
    "as_prompt_format",
    "encode_pairs",
    "encode_prompts",
    "group_into_blocks",
    "special_token_counts",
    "target_text",
    "tokenize_prompts",
]
