"""How a run turns sources into prompt token ids: its template and fields, chat template, special tokens, truncation.

A :class:`PromptFormat` is recorded in every export of a prompt/target run (the ``prompt_format`` key of
``skip_schedule.json``), so ``generate``, ``evaluate``, the conformance kit and the export's ``custom_generate``
build from a bare source exactly the prompt ids training built. This module is that one implementation for all of
them: it needs only the standard library and a Hugging Face tokenizer passed in, because every export ships it as
``custom_generate/prompt_format.py`` for plain transformers, without skiptrain.

The rules:

- A template names its fields as ``{name}`` (letters, digits, underscores); ``{source}`` is the task's source
  column, any other name the data column of that name. Other braces are literal. Fields are filled in one pass.
- Without ``chat_template`` the filled template is tokenised with the tokenizer's special tokens (e.g. BOS), and a
  trailing special token the tokenizer appends (e.g. EOS) is removed. With ``chat_template`` the filled template is
  the user message (after ``system_message``, if any) of the tokenizer's own ``apply_chat_template`` with the
  generation prompt added; that text holds its special tokens, so it is tokenised without adding any.
- A source that is a chat, ``{"messages": [{"role": ..., "content": ...}, ...]}`` (or its JSON text) with roles
  system/user/assistant and the user's turn last, is rendered whole by the chat template with the generation prompt
  (``chat_template`` and the ``{source}`` template only): its last turn is the field, the turns before it the history.
  ``system_message`` is put first unless the chat opens with its own system turn.
- With ``max_source_tokens`` a prompt longer than that many tokens first loses its oldest history turns (a leading
  system turn is kept), then has its last field trimmed, at a token boundary, until it fits; the template is never
  cut.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SOURCE_FIELD = "source"
RAW_TEMPLATE = "{source}"
MESSAGES = "messages"
ROLES = ("system", "user", "assistant")


class PromptFormatError(ValueError):
    """A template, or a source given to fill it, that the prompt format refuses (the message names the field)."""

    exit_code = 2


PromptSource = str | Mapping[str, Any]
"""What fills a template: a bare string for a one-field template, or an object of field values (or its JSON text), or
a chat ``{"messages": [...]}``."""

Turn = dict[str, str]
"""One chat turn: ``{"role": ..., "content": ...}``."""


def chat_turns(source: Any) -> list[Turn] | None:
    """The turns of a chat source, ``{"messages": [...]}`` or its JSON text; ``None`` for any other source.

    Raises:
        PromptFormatError: naming the turn of a chat that is not a list of ``{role, content}`` turns with roles
            system/user/assistant.
    """
    if isinstance(source, str) and source.startswith("{") and f'"{MESSAGES}"' in source:
        try:
            source = json.loads(source)
        except json.JSONDecodeError:
            return None
    if not isinstance(source, Mapping) or MESSAGES not in source:
        return None
    turns = source[MESSAGES]
    if not isinstance(turns, list) or not turns:
        raise PromptFormatError(f"messages={turns!r} is invalid: allowed a non-empty list of {{role, content}} turns")
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or turn.get("role") not in ROLES or not isinstance(turn.get("content"), str):
            raise PromptFormatError(f"messages[{i}]={turn!r} is invalid: allowed {{'role': one of {list(ROLES)}, "
                                    "'content': text}")
    return [{"role": turn["role"], "content": turn["content"]} for turn in turns]


@dataclass(frozen=True)
class PromptFormat:
    """The prompt format of a run.

    Args:
        template: The prompt with its ``{field}`` placeholders; ``{source}`` uses a bare source as it is.
        chat_template: Wrap the filled template with the tokenizer's ``apply_chat_template`` as the user message.
        system_message: The system message before it (``chat_template`` only).
        max_source_tokens: Prompt length limit in tokens, special tokens included (``None``: no limit).
    """

    template: str = RAW_TEMPLATE
    chat_template: bool = False
    system_message: str | None = None
    max_source_tokens: int | None = None

    def __post_init__(self) -> None:
        names = FIELD.findall(self.template)
        if not names:
            raise PromptFormatError(f"prompt_template={self.template!r} names no field: allowed a template with "
                                    "'{source}' or '{column}' placeholders")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise PromptFormatError(f"prompt_template={self.template!r} names {repeated} more than once: allowed "
                                    "each field once")
        if self.system_message is not None and not self.chat_template:
            raise PromptFormatError(f"system_message={self.system_message!r} needs chat_template=true: a system "
                                    "message is a chat turn")

    # -- fields ---------------------------------------------------------------------------------------------------
    @property
    def fields(self) -> tuple[str, ...]:
        """The template's field names, in order."""
        return tuple(FIELD.findall(self.template))

    @property
    def is_raw(self) -> bool:
        """Whether prompts are used as given (the ``{source}`` template, no chat template, no limit)."""
        return self == PromptFormat()

    def prompt_of(self, source: PromptSource) -> tuple[list[Turn], dict[str, str]]:
        """The chat history and the field values of one source (the history is empty unless it is a chat).

        Raises:
            PromptFormatError: for a chat given to a format without the chat template or with a template of its
                own, or one whose last turn is not the user's; otherwise as :meth:`values`.
        """
        turns = chat_turns(source)
        if turns is None:
            return [], self.values(source)
        if not self.chat_template or self.template != RAW_TEMPLATE:
            raise PromptFormatError(f"a {{'messages': [...]}} prompt needs chat_template=true and the template "
                                    f"{RAW_TEMPLATE!r}; this format has chat_template={self.chat_template}, template "
                                    f"{self.template!r}: give a bare source instead")
        if turns[-1]["role"] != "user":
            raise PromptFormatError(f"messages[-1] has role {turns[-1]['role']!r}: allowed a chat whose last turn is "
                                    "the user's (the reply is generated)")
        return turns[:-1], {SOURCE_FIELD: turns[-1]["content"]}

    def values(self, source: PromptSource) -> dict[str, str]:
        """The field values of one source: a bare string fills a one-field template; an object (or its JSON text)
        names every field.

        Raises:
            PromptFormatError: naming the fields missing from an object, or a bare string for several fields.
        """
        if isinstance(source, str) and len(self.fields) == 1:
            return {self.fields[0]: source}
        if isinstance(source, str):
            try:
                source = json.loads(source)
            except json.JSONDecodeError:
                source = None
            if not isinstance(source, Mapping):
                raise PromptFormatError(f"the template {self.template!r} has fields {list(self.fields)}: allowed an "
                                        "object of their values, not a bare string")
        missing = [name for name in self.fields if name not in source]
        if missing:
            raise PromptFormatError(f"missing field(s) {missing} for the template {self.template!r}: allowed an "
                                    f"object with {list(self.fields)}; got {sorted(source)}")
        return {name: str(source[name]) for name in self.fields}

    def fill(self, values: Mapping[str, str]) -> str:
        """The template with every field replaced by its value (one pass: values are never filled again)."""
        return FIELD.sub(lambda match: values[match[1]], self.template)

    # -- text and ids ---------------------------------------------------------------------------------------------
    def render(self, tokenizer: Any, values: Mapping[str, str], history: Sequence[Turn] = ()) -> str:
        """The prompt text: the filled template, wrapped by the chat template (after ``history``) when
        ``chat_template``."""
        text = self.fill(values)
        if not self.chat_template:
            return text
        if not getattr(tokenizer, "chat_template", None):
            raise PromptFormatError(f"chat_template=true needs a tokenizer with a chat template: "
                                    f"{getattr(tokenizer, 'name_or_path', 'this tokenizer')!r} has none; use a chat "
                                    "(instruct) model's tokenizer, or, for data that is not a chat, set "
                                    "chat_template=false")
        own_system = bool(history) and history[0]["role"] == "system"
        system = [{"role": "system", "content": self.system_message}] \
            if self.system_message is not None and not own_system else []
        return tokenizer.apply_chat_template([*system, *history, {"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)

    def tokenize(self, tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of prompt texts under this format's special-token rule; nothing trimmed."""
        if self.chat_template:
            return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
        n_suffix = special_token_counts(tokenizer)[1]
        return [list(ids[: len(ids) - n_suffix]) for ids in tokenizer(list(texts))["input_ids"]]

    def encode(self, tokenizer: Any, sources: Sequence[PromptSource]) -> tuple[list[str], list[list[int]]]:
        """Prompt texts and ids of ``sources``, fitted to ``max_source_tokens`` (oldest chat turns dropped, then the
        last field trimmed).

        Raises:
            PromptFormatError: for a source that does not fill the template, or a template that alone takes
                ``max_source_tokens`` or more.
        """
        prompts = [self.prompt_of(source) for source in sources]
        texts = [self.render(tokenizer, values, history) for history, values in prompts]
        ids = self.tokenize(tokenizer, texts)
        if self.max_source_tokens is None:
            return texts, ids
        trimmed = self.fields[-1]
        overhead = len(self.tokenize(tokenizer, [self.render(tokenizer, {**prompts[0][1], trimmed: ""})])[0]) \
            if prompts else 0
        if overhead >= self.max_source_tokens:
            raise PromptFormatError(f"max_source_tokens={self.max_source_tokens} leaves no room for the source: the "
                                    f"prompt template alone takes {overhead} tokens ({self.template!r})")
        for i, row in enumerate(ids):
            if len(row) > self.max_source_tokens:
                texts[i], ids[i] = self._trimmed(tokenizer, *prompts[i])
        return texts, ids

    def _overhead(self, tokenizer: Any, values: dict[str, str], history: Sequence[Turn]) -> int:
        """Prompt tokens besides the last field's."""
        return len(self.tokenize(tokenizer, [self.render(tokenizer, {**values, self.fields[-1]: ""}, history)])[0])

    def _trimmed(self, tokenizer: Any, history: list[Turn], values: dict[str, str]) -> tuple[str, list[int]]:
        """Prompt (text, ids) fitted to ``max_source_tokens``: the oldest history turns (but a leading system turn)
        dropped while the rest leaves no room, then the last field cut at a token boundary."""
        keep = 1 if history and history[0]["role"] == "system" else 0
        while len(history) > keep and self._overhead(tokenizer, values, history) >= self.max_source_tokens:
            history = history[:keep] + history[keep + 1:]
        field = self.fields[-1]
        source = values[field]
        encoded = tokenizer(source, add_special_tokens=False, return_offsets_mapping=bool(tokenizer.is_fast))
        source_ids, offsets = encoded["input_ids"], encoded.get("offset_mapping")
        budget = min(len(source_ids), self.max_source_tokens - self._overhead(tokenizer, values, history))
        while budget > 0:
            cut = source[: offsets[budget - 1][1]] if offsets else tokenizer.decode(source_ids[:budget])
            text = self.render(tokenizer, {**values, field: cut.rstrip()}, history)
            ids = self.tokenize(tokenizer, [text])[0]
            if len(ids) <= self.max_source_tokens:
                return text, ids
            budget -= max(1, len(ids) - self.max_source_tokens)
        text = self.render(tokenizer, {**values, field: ""}, history)
        return text, self.tokenize(tokenizer, [text])[0]

    # -- the record -----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``prompt_format`` object of ``skip_schedule.json`` (``fields``, ``add_special_tokens`` and
        ``trimmed_field`` are derived, for readers that do not run this module)."""
        return {
            "template": self.template,
            "fields": list(self.fields),
            "chat_template": self.chat_template,
            "system_message": self.system_message,
            "add_special_tokens": not self.chat_template,
            "max_source_tokens": self.max_source_tokens,
            "trimmed_field": self.fields[-1],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromptFormat:
        """The inverse of :meth:`to_dict`.

        Raises:
            PromptFormatError: for an object without a string ``template``.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("template"), str):
            raise PromptFormatError(f"prompt_format={data!r} is invalid: allowed an object with a string 'template'")
        limit = data.get("max_source_tokens")
        return cls(data["template"], bool(data.get("chat_template")), data.get("system_message"),
                   None if limit is None else int(limit))


def special_token_counts(tokenizer: Any) -> tuple[int, int]:
    """How many special tokens the tokenizer adds before and after the text with ``add_special_tokens=True``.

    Returns:
        ``(n_prefix, n_suffix)``, e.g. ``(1, 0)`` for Llama-style BOS, ``(0, 0)`` for GPT-2.
    """
    plain = tokenizer("a b", add_special_tokens=False)["input_ids"]
    full = tokenizer("a b", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return start, len(full) - start - len(plain)
    return 0, 0


__all__ = ["MESSAGES", "RAW_TEMPLATE", "ROLES", "SOURCE_FIELD", "PromptFormat", "PromptFormatError", "PromptSource",
           "Turn", "chat_turns", "special_token_counts"]
