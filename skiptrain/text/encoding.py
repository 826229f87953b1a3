"""Tokenisation and truncation of prompts and targets (pure functions over a Hugging Face tokenizer).

Only the source is ever trimmed to fit ``max_source_tokens``, never the template; targets are tokenised in the
context of their prompt and end with EOS. Plain text is cut into fixed-size blocks (:func:`group_into_blocks`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from skiptrain.errors import DataError, UsageError
from skiptrain.text.tasks import fill_template


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


def tokenize_prompts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of filled prompts: special tokens such as BOS kept, a trailing EOS removed, nothing trimmed.

    Training prompts (:func:`encode_prompts`) and raw inference prompts are tokenised by this one function, so
    the same text gives the same ids in both.
    """
    _, n_suffix = special_token_counts(tokenizer)
    return [_strip_suffix(ids, n_suffix) for ids in tokenizer(list(texts))["input_ids"]]


def _truncate_source(
    tokenizer: Any, template: str, source: str, max_source_tokens: int, overhead: int, n_suffix: int
) -> tuple[str, list[int]]:
    """Filled prompt (text, ids) with ``source`` cut at a token boundary so it fits ``max_source_tokens``.

    ``overhead`` is the length of the template filled with nothing.
    """
    enc = tokenizer(source, add_special_tokens=False, return_offsets_mapping=bool(tokenizer.is_fast))
    src_ids = enc["input_ids"]
    offsets = enc.get("offset_mapping")
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
        raise UsageError(
            f"max_source_tokens={max_source_tokens} leaves no room for the source: the prompt template alone "
            f"takes {overhead} tokens ({template!r})"
        )
    texts = [fill_template(template, s) for s in sources]
    ids = tokenize_prompts(tokenizer, texts)
    for i, row in enumerate(ids):
        if len(row) > max_source_tokens:
            texts[i], ids[i] = _truncate_source(
                tokenizer, template, sources[i], max_source_tokens, overhead, n_suffix
            )
    return texts, ids


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
        raise DataError("the tokenizer has no eos_token; targets must end with EOS")
    prompt_texts, prompt_ids = encode_prompts(tokenizer, template, sources, max_source_tokens)
    continuations = [target_text(p, t) for p, t in zip(prompt_texts, targets, strict=True)]
    full_ids = tokenize_prompts(tokenizer, [p + c for p, c in zip(prompt_texts, continuations, strict=True)])
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
    "encode_pairs",
    "encode_prompts",
    "group_into_blocks",
    "special_token_counts",
    "target_text",
    "tokenize_prompts",
]
