"""Prompts in, completions out: reading prompt files, fitting prompts to the context, batching them as training
batches hold prompts, and writing completions as JSON lines.

Prompts are made into prompt ids by the run's prompt format as training made them
(:class:`~skiptrain.shipped.prompt_format.PromptFormat`; raw prompts are used as given) and left-padded per batch by
the batch contract (:func:`~skiptrain.text.batch.collate_prompts`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from skiptrain.core import log
from skiptrain.errors import PromptError, UsageError
from skiptrain.shipped.prompt_format import ROLES, PromptFormat, PromptSource
from skiptrain.text.batch import collate_prompts
from skiptrain.text.encoding import tokenize_prompts

STDIO = "-"
RAW = PromptFormat()
"""Prompts used as given (``--raw_prompts true``, or a model that records no prompt format)."""
LongPrompts = Literal["refuse", "truncate"]
LONG_PROMPTS: tuple[LongPrompts, ...] = ("refuse", "truncate")


# -- reading ---------------------------------------------------------------------------------------------------------
def read_prompts(path: str, stdin: TextIO | None = None) -> list[PromptSource]:
    """Prompts from a ``.jsonl`` file, a text file (one prompt per line) or stdin.

    A JSON line holds a ``prompt`` string (a bare source for the run's template, or the whole prompt with raw
    prompts), a ``template`` object of the field values for a template of several fields, e.g.
    ``{"template": {"name": "The Eagle", "area": "riverside"}}``, or a chat, ``{"messages": [{"role": ...,
    "content": ...}, ...]}`` whose last turn is the user's, passed on intact as the source for the recorded chat
    template. Stdin (``path == "-"``) is read as JSON lines when its first non-blank line starts with ``{``, else as
    text.

    Raises:
        PromptError: for a missing or unreadable file, and naming the file and line of a malformed JSON line, a line
            without one of those fields, a malformed chat, or an empty prompt.
    """
    if path == STDIO:
        text, origin = (stdin or sys.stdin).read(), "stdin"
        as_json = text.lstrip().startswith("{")
    else:
        origin = f"prompts={path!r}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as err:
            raise PromptError(f"{origin}: no such file; give a .jsonl or text file of prompts, or - for stdin") from err
        except (OSError, UnicodeDecodeError) as err:
            raise PromptError(f"{origin} cannot be read as UTF-8 text ({err}): give a .jsonl or text file") from err
        as_json = Path(path).suffix.lower() in (".jsonl", ".json")
    prompts: list[PromptSource] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{origin} line {number}"
        prompt = _json_prompt(line, where) if as_json else line
        if isinstance(prompt, str) and not prompt.strip():
            raise PromptError(f"{where}: empty prompt")
        prompts.append(prompt)
    if not prompts:
        raise PromptError(f"{origin}: no prompts")
    return prompts


def _json_prompt(line: str, where: str) -> PromptSource:
    """The source on one JSON line (see :func:`read_prompts`)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise PromptError(f"{where}: not valid JSON: {err}") from err
    if isinstance(record, dict) and "messages" in record:
        check_chat(record["messages"], where)
        return record
    if isinstance(record, dict) and isinstance(record.get("template"), dict):
        return {str(k): str(v) for k, v in record["template"].items()}
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return record["prompt"]
    raise PromptError(f"{where}: expected an object with a string 'prompt' field, a 'template' object of field "
                      "values or a 'messages' list")


def check_chat(messages: Any, where: str) -> None:
    """Refuse a chat that is not a list of ``{role, content}`` turns ending with the user's.

    Raises:
        PromptError: naming ``where``, the turn and the allowed values.
    """
    if not isinstance(messages, list) or not messages:
        raise PromptError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} turns")
    for turn, message in enumerate(messages, start=1):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str):
            raise PromptError(f"{where}: message {turn} must be an object with a string 'content'")
        if message.get("role") not in ROLES:
            raise PromptError(f"{where}: message {turn} has role={message.get('role')!r}: allowed one of "
                              f"{list(ROLES)}")
    if messages[-1]["role"] != "user":
        raise PromptError(f"{where}: the last message has role={messages[-1]['role']!r}: allowed 'user' (the turn "
                          "the model answers)")


def prompt_text(prompt: PromptSource) -> str:
    """A prompt as a line of text: a string as it is, a ``template`` or ``messages`` object as its JSON object."""
    return prompt if isinstance(prompt, str) else json.dumps(dict(prompt), ensure_ascii=False)


def chosen_prompt_format(recorded: PromptFormat | None, raw: bool) -> PromptFormat:
    """The prompt format that makes prompts from the given ones, said in one line: the model's ``recorded`` one, or
    raw (with ``raw``, or when the model records none)."""
    if raw:
        return RAW
    if recorded is None:
        log.info("skiptrain: the model records no prompt format: prompts are used as given")
        return RAW
    log.info(f"skiptrain: each prompt fills the recorded template {recorded.template!r}"
             + (" inside the chat template" if recorded.chat_template else "")
             + " (--raw_prompts true uses prompts as given)")
    return recorded


# -- fitting and batching ----------------------------------------------------------------------------------------------
def fit_prompts(
    tokenizer: Any, prompts: Sequence[PromptSource], context_length: int | None, max_new_tokens: int,
    long_prompts: LongPrompts = "refuse", prompt_format: PromptFormat = RAW,
) -> tuple[list[PromptSource], PromptFormat]:
    """Prompts, and the prompt format to make them with, that leave room for ``max_new_tokens`` in the model's
    ``context_length`` (``None``: no limit).

    Sources that the format's ``max_source_tokens`` cuts (as training cut them) are named in one warning. A prompt
    still too long for the context is refused, or with ``long_prompts="truncate"`` shortened with a warning: a raw
    prompt to its last tokens that fit, a prompt made by a template by trimming its source further (the format's
    ``max_source_tokens`` is lowered), never the template.

    Raises:
        UsageError: for ``max_new_tokens`` that alone fill the context.
        PromptError: naming the first prompt that does not fit (``long_prompts="refuse"``).
    """
    ids = prompt_format.encode(tokenizer, prompts)[1]
    if prompt_format.max_source_tokens is not None:
        _say_cut_sources(tokenizer, prompts, prompt_format, ids)
    if context_length is None:
        return list(prompts), prompt_format
    budget = context_length - max_new_tokens
    if budget < 1:
        raise UsageError(f"max_new_tokens={max_new_tokens} is invalid for a model whose context length is "
                         f"{context_length} tokens: allowed 1 <= max_new_tokens < {context_length}")
    fitted = list(prompts)
    for number, row in enumerate(ids, start=1):
        if len(row) <= budget:
            continue
        if long_prompts != "truncate":
            raise PromptError(
                f"prompt {number} has {len(row)} tokens, and with max_new_tokens={max_new_tokens} it exceeds the "
                f"model's context length of {context_length} tokens: shorten it, lower --max_new_tokens, or pass "
                "--long_prompts truncate to keep its last tokens"
            )
        kept = "its last" if prompt_format.is_raw else "its source trimmed to"
        log.warn(f"skiptrain generate: prompt {number} has {len(row)} tokens; truncated to {kept} {budget} or "
                 f"fewer so that max_new_tokens={max_new_tokens} fit the context of {context_length}")
        if prompt_format.is_raw:
            fitted[number - 1] = _prompt_tail(tokenizer, prompts[number - 1], budget)
        else:
            limit = min(prompt_format.max_source_tokens or budget, budget)
            prompt_format = dataclasses.replace(prompt_format, max_source_tokens=limit)
    return fitted, prompt_format


def _say_cut_sources(tokenizer: Any, prompts: Sequence[PromptSource], prompt_format: PromptFormat,
                     ids: list[list[int]]) -> None:
    """Warn in one line which prompts the format's ``max_source_tokens`` cut, and to how many tokens."""
    whole = dataclasses.replace(prompt_format, max_source_tokens=None).encode(tokenizer, prompts)[1]
    cut = [f"prompt {number} from {len(full)} to {len(kept)} tokens"
           for number, (full, kept) in enumerate(zip(whole, ids, strict=True), start=1) if len(full) > len(kept)]
    if cut:
        log.warn(f"skiptrain generate: sources cut to the recorded max_source_tokens="
                 f"{prompt_format.max_source_tokens}, as in training: {', '.join(cut)}")


def _prompt_tail(tokenizer: Any, prompt: str, budget: int) -> str:
    """The longest tail of ``prompt`` (whole tokens) that tokenises to at most ``budget`` tokens."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    for cut in range(max(len(ids) - budget, 0), len(ids)):
        tail = tokenizer.decode(ids[cut:])
        if len(tokenize_prompts(tokenizer, [tail])[0]) <= budget:
            return tail
    raise PromptError(f"a prompt cannot be truncated to {budget} tokens")


def check_batch_size(batch_size: int) -> None:
    """Refuse a ``batch_size`` below 1 (before anything is loaded: :func:`prompt_batches` runs lazily)."""
    if batch_size < 1:
        raise UsageError(f"batch_size={batch_size} is invalid: allowed >= 1")


def prompt_batches(tokenizer: Any, prompts: Sequence[PromptSource], batch_size: int, prompt_format: PromptFormat = RAW
                   ) -> Iterator[dict[str, Any]]:
    """Batches of ``batch_size`` prompts made by ``prompt_format`` (raw by default), left-padded as training batches
    hold prompts.

    Raises:
        ValueError: If ``batch_size < 1``.
    """
    check_batch_size(batch_size)
    prompt_ids = prompt_format.encode(tokenizer, prompts)[1]
    for start in range(0, len(prompt_ids), batch_size):
        yield collate_prompts(prompt_ids[start:start + batch_size], tokenizer.pad_token_id)


# -- writing ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Completion:
    """One generated completion (a line of ``generate``'s JSON-lines output)."""

    prompt: str
    """The prompt as given: a source, a raw prompt, or the JSON object of a ``template`` or ``messages`` line."""
    completion: str
    num_tokens: int
    """Generated tokens, the end-of-sequence token included."""
    token_ids: list[int]
    """The generated token ids (``num_tokens`` of them)."""


def write_completions(completions: Sequence[Completion], path: str, stdout: TextIO | None = None) -> None:
    """Write JSON lines (``prompt``, ``completion``, ``num_tokens``, ``token_ids``) to a file or stdout (``-``)."""
    text = "".join(json.dumps(asdict(c), ensure_ascii=False) + "\n" for c in completions)
    if path == STDIO:
        (stdout or sys.stdout).write(text)
        (stdout or sys.stdout).flush()
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


__all__ = ["LONG_PROMPTS", "RAW", "STDIO", "Completion", "LongPrompts", "check_batch_size", "check_chat",
           "chosen_prompt_format", "fit_prompts", "prompt_batches", "prompt_text", "read_prompts", "write_completions"]
