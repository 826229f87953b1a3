"""The shapes of data the ecosystem uses, detected and read into canonical ``source``/``target`` examples.

- ``messages``: ``messages``, a list of ``{role, content}`` turns (roles system/user/assistant; OpenAI, TRL);
- ``sharegpt``: ``conversations``, a list of ``{from, value}`` turns (``human``/``gpt``/``system``);
- ``alpaca``: ``instruction``, an optional ``input``, ``output``;
- ``prompt_completion``: TRL's ``prompt``/``completion``, both strings or both lists of turns;
- ``text``: plain language modelling (the ``text`` task).

A conversation with ``k`` assistant turns gives ``k`` examples: each one's source is the chat up to that turn,
``{"messages": [...]}`` (rendered by the chat template with the generation prompt, see
:class:`~skiptrain.shipped.prompt_format.PromptFormat`), its target that assistant turn. This is what serving sees: the
history comes back as the prompt, prefilled at full depth, and the reply is generated from index 0 (docs/method.md,
"Conversations").

A row that gives no example (no assistant turn, an unknown role, an empty target, a missing column, ...) is skipped
and counted, and the log names the first row of each kind; a split with no usable row is refused in one line.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from skiptrain.data.columns import TARGET
from skiptrain.data.loading import first_row
from skiptrain.errors import DataError, UsageError
from skiptrain.shipped.prompt_format import MESSAGES, RAW_TEMPLATE, ROLES, Turn
from skiptrain.text.batch import SOURCE
from skiptrain.text.tasks import AUTO, CHAT_FORMATS, TASKS

ROW = "row"
"""Column of a read split: the number (from 0) of the row each example came from."""
PROBLEM = "problem"

SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}

# format -> the columns that identify it, in the order they are tried
SIGNATURES: dict[str, tuple[str, ...]] = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}


def detect_format(columns: Sequence[str], origin: str) -> str:
    """The format of data with these columns (the first of :data:`SIGNATURES` whose columns are all there).

    Raises:
        DataError: naming ``origin``, the columns found and what each format needs.
    """
    for name, needed in SIGNATURES.items():
        if all(column in columns for column in needed):
            return name
    wanted = "; ".join(f"{name}: {list(needed)}" for name, needed in SIGNATURES.items())
    raise DataError(f"{origin}: data.task=auto found no known format in the columns {list(columns)}; allowed: "
                    f"{wanted}. Name the task and its columns (data.task, data.source_column, data.target_column)")


def is_conversational(row: Mapping[str, Any]) -> bool:
    """Whether a ``prompt_completion`` row holds lists of turns (TRL's conversational form)."""
    return isinstance(row.get("prompt"), list)


class BadRow(Exception):  # noqa: N818 - a row, not a failure of the program
    """A row that gives no example: what is wrong (``kind``) and where (``field``)."""

    def __init__(self, kind: str, field: str) -> None:
        super().__init__(kind, field)
        self.kind, self.field = kind, field


def _column(row: Mapping[str, Any], name: str) -> Any:
    if row.get(name) is None:
        raise BadRow("a missing column", name)
    return row[name]


def _turns(value: Any, field: str, role_key: str = "role", content_key: str = "content",
           roles: Mapping[str, str] | None = None) -> list[Turn]:
    if not isinstance(value, list):
        raise BadRow("not a list of turns", field)
    turns = []
    for i, turn in enumerate(value):
        role = turn.get(role_key) if isinstance(turn, Mapping) else None
        role = roles.get(role) if roles is not None else role
        if role not in ROLES:
            raise BadRow("an unknown role", f"{field}[{i}].{role_key}")
        content = turn.get(content_key)
        if not isinstance(content, str):
            raise BadRow("a turn without text", f"{field}[{i}].{content_key}")
        turns.append({"role": role, "content": content})
    return turns


def chat_source(turns: Sequence[Turn]) -> str:
    """The source of a chat prompt: ``{"messages": [...]}`` as JSON text."""
    return json.dumps({MESSAGES: list(turns)}, ensure_ascii=False)


def conversation_examples(turns: Sequence[Turn], field: str) -> list[tuple[str, str]]:
    """One ``(source, target)`` per assistant turn: the chat before it, and the turn.

    Raises:
        BadRow: for a chat without an assistant turn, an assistant turn that does not answer a user turn, or an
            empty one.
    """
    examples = []
    for i, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        if i == 0 or turns[i - 1]["role"] != "user":
            raise BadRow("an assistant turn that does not follow a user turn", f"{field}[{i}]")
        if not turn["content"].strip():
            raise BadRow("an empty target", f"{field}[{i}].content")
        examples.append((chat_source(turns[:i]), turn["content"]))
    if not examples:
        raise BadRow("no assistant turn", field)
    return examples


def _text(row: Mapping[str, Any], name: str, kind: str = "an empty target") -> str:
    value = _column(row, name)
    if not isinstance(value, str) or not value.strip():
        raise BadRow(kind, name)
    return value.strip()


def messages_examples(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The examples of a ``messages`` row: one per assistant turn."""
    return conversation_examples(_turns(_column(row, "messages"), "messages"), "messages")


def sharegpt_examples(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The examples of a ShareGPT row (``human``/``gpt``/``system`` turns): one per ``gpt`` turn."""
    turns = _turns(_column(row, "conversations"), "conversations", "from", "value", SHAREGPT_ROLES)
    return conversation_examples(turns, "conversations")


def alpaca_examples(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The example of an Alpaca row: the instruction, then a blank line and the input if any; the output."""
    instruction = _text(row, "instruction", "an empty instruction")
    extra = row.get("input")
    source = f"{instruction}\n\n{extra.strip()}" if isinstance(extra, str) and extra.strip() else instruction
    return [(source, _text(row, "output"))]


def prompt_completion_examples(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The example of a TRL prompt/completion row: strings as they are, or a chat and its one assistant reply."""
    prompt, completion = _column(row, "prompt"), _column(row, "completion")
    if isinstance(prompt, str):
        if not isinstance(completion, str):
            raise BadRow("a text prompt with a completion that is not text", "completion")
        return [(_text(row, "prompt", "an empty prompt"), _text(row, "completion"))]
    turns = _turns(prompt, "prompt")
    reply = _turns(completion, "completion")
    if [turn["role"] for turn in reply] != ["assistant"]:
        raise BadRow("a completion that is not one assistant turn", "completion")
    return conversation_examples([*turns, *reply], "prompt")


READERS = {
    "messages": messages_examples,
    "sharegpt": sharegpt_examples,
    "alpaca": alpaca_examples,
    "prompt_completion": prompt_completion_examples,
}


def _read_batch(batch: dict[str, list[Any]], indices: list[int], row_format: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {SOURCE: [], TARGET: [], ROW: [], PROBLEM: []}
    for position, index in enumerate(indices):
        row = {name: values[position] for name, values in batch.items()}
        try:
            examples, problem = READERS[row_format](row), ""
        except BadRow as bad:
            examples, problem = [("", "")], f"{bad.kind}\t{bad.field}"
        for source, target in examples:
            out[SOURCE].append(source)
            out[TARGET].append(target)
            out[ROW].append(index)
            out[PROBLEM].append(problem)
    return out


def read_examples(dataset: datasets.Dataset, row_format: str, where: str) -> datasets.Dataset:
    """The examples of a split in ``row_format``: columns ``source``, ``target`` and ``row``.

    Logs one line with the format and how many examples the rows gave, and one with the rows skipped, by kind.

    Raises:
        DataError: naming ``where``, the row, the field and what is wrong, when no row gives an example.
    """
    read = dataset.map(_read_batch, batched=True, with_indices=True, fn_kwargs={"row_format": row_format},
                       remove_columns=dataset.column_names, desc=f"read {row_format} rows")
    bad = read.filter(lambda b: [bool(p) for p in b[PROBLEM]], batched=True, desc="find bad rows")
    problems = [(row, *problem.split("\t")) for row, problem in zip(bad[ROW], bad[PROBLEM], strict=True)]
    if len(problems) == len(dataset):
        row, kind, field = problems[0]
        raise DataError(f"{where}, row {row + 1}, field {field!r}: {kind}; no row of the split gives an example "
                        f"of the {row_format} format")
    examples = read.filter(lambda b: [not p for p in b[PROBLEM]], batched=True, desc="keep good rows")
    examples = examples.remove_columns(PROBLEM)
    rows = "conversations" if examples[0][SOURCE].startswith(chat_source([])[:12]) else "rows"
    rank_zero_info(f"{where}: {row_format} format, {len(examples)} examples from {len(dataset) - len(problems)} "
                   f"{rows}")
    if problems:
        counts = Counter(kind for _, kind, _ in problems)
        first = {kind: (row, field) for row, kind, field in reversed(problems)}
        kinds = ", ".join(f"{n} with {kind} (first: row {first[kind][0] + 1}, field {first[kind][1]!r})"
                          for kind, n in counts.items())
        rank_zero_warn(f"{where}: skipped {len(problems)} of {len(dataset)} rows: {kinds}")
    return examples


def hold_out(data: datasets.Dataset, share: float, seed: int
             ) -> tuple[datasets.Dataset, datasets.Dataset, int, int] | None:
    """A seeded ``share`` of the rows (whole conversations, by the ``row`` column when there is one) split off:
    ``(kept, held_out, rows_held_out, rows)``, or ``None`` when there are too few rows to hold one out."""
    groups = data[ROW] if ROW in data.column_names else list(range(len(data)))
    unique = sorted(set(groups))
    count = max(1, round(share * len(unique)))
    if count >= len(unique):
        return None
    held = set(random.Random(seed).sample(unique, count))
    kept_rows = [i for i, group in enumerate(groups) if group not in held]
    held_rows = [i for i, group in enumerate(groups) if group in held]
    return data.select(kept_rows), data.select(held_rows), count, len(unique)


def resolve_task(task: str, data_files: Mapping[str, Any] | None, dataset_id: str | None, dataset_config: str | None,
                 split: str | None, chat_template: bool | None, prompt_template: str | None) -> tuple[str, bool]:
    """The task to run (``auto`` detected from the data's first row) and whether its prompts use the chat template
    by default (chats always do).

    Raises:
        UsageError: for ``auto`` without data, or options a chat cannot take (``chat_template=false``, a template).
        DataError: for data whose columns match no format.
    """
    if data_files is None and dataset_id is None and (task == AUTO or task in READERS):
        raise UsageError(f"task={task!r} reads your data: give data.data_files or data.dataset_id, or name a task "
                         f"with data of its own; allowed values: {[AUTO, *sorted(TASKS)]}")
    if task not in (AUTO, "prompt_completion"):
        return task, TASKS[task].chat if task in TASKS else False
    row, origin = first_row(split or "train", data_files, dataset_id, dataset_config)
    if task == AUTO:
        task = detect_format(list(row), origin)
    chats = task in CHAT_FORMATS or (task == "prompt_completion" and is_conversational(row))
    if chats and (chat_template is False or prompt_template not in (None, RAW_TEMPLATE)):
        raise UsageError(f"{origin} holds {task} chats, rendered whole by the tokenizer's chat template: leave "
                         "data.chat_template and data.prompt_template unset")
    return task, chats or TASKS[task].chat


__all__ = ["READERS", "ROW", "SIGNATURES", "BadRow", "chat_source", "conversation_examples", "detect_format",
           "hold_out", "is_conversational", "read_examples", "resolve_task"]
