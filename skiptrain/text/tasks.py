"""The task table: what skiptrain knows about each supported task (dataset, columns, prompt template, metric).

Prompt templates name their fields as ``{source}`` (the task's source column) or ``{column}`` (any other data
column), filled in one pass by :class:`~skiptrain.shipped.prompt_format.PromptFormat`; other braces are literal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from skiptrain.errors import UsageError
from skiptrain.shipped.prompt_format import PromptFormat, PromptFormatError

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
        row_format: For the tasks named after a shape of data (``messages``, ``sharegpt``, ``alpaca``,
            ``prompt_completion``): that shape, read by :mod:`skiptrain.data.formats`; ``None`` for the column tasks.
        chat: Prompts are made with the tokenizer's chat template unless ``chat_template`` says otherwise.
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
    row_format: str | None = None
    chat: bool = False

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

# The shapes of data the ecosystem uses (OpenAI/TRL messages, ShareGPT, Alpaca, TRL prompt/completion), each a task
# over local files or a dataset id; a conversation is rendered whole by the chat template (template ``{source}``).
CHAT_FORMATS = ("messages", "sharegpt")


def _format_task(name: str, source: str, target: str, chat: bool = True) -> TaskSpec:
    return TaskSpec(name=name, dataset_id=None, dataset_config=None, source_column=source, target_column=target,
                    prompt_template=SOURCE_PLACEHOLDER, metric=None, row_format=name, chat=chat)


TASKS.update({spec.name: spec for spec in (
    _format_task("messages", "messages", "messages"),
    _format_task("sharegpt", "conversations", "conversations"),
    _format_task("alpaca", "instruction", "output"),
    _format_task("prompt_completion", "prompt", "completion", chat=False),  # chat when its prompts are messages
)})

AUTO = "auto"
"""The task that detects its format from the columns of the data (:func:`~skiptrain.data.formats.detect_format`)."""


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
        raise UsageError(f"task={task!r} is not supported; allowed values: {[AUTO, *sorted(TASKS)]}")
    return TASKS[task]


def validate_template(template: str) -> str:
    """Check that a prompt template names its fields well: at least one, each once.

    Args:
        template: The template.

    Returns:
        The template, unchanged.

    Raises:
        UsageError: naming ``prompt_template`` when it has no field or repeats one.
    """
    try:
        PromptFormat(template)
    except PromptFormatError as err:
        raise UsageError(str(err)) from err
    return template


def fill_template(template: str, source: str) -> str:
    """A one-field ``template`` filled with ``source`` (other braces in the template are literal)."""
    prompt_format = PromptFormat(template)
    return prompt_format.fill(prompt_format.values(source))


__all__ = [
    "AUTO",
    "BUILTIN_TEMPLATE",
    "CHAT_FORMATS",
    "E2E_TEMPLATE",
    "SOURCE_PLACEHOLDER",
    "SUMMARY_TEMPLATE",
    "TASKS",
    "XSUM_TEMPLATE",
    "MetricKind",
    "TaskSpec",
    "fill_template",
    "get_task_spec",
    "validate_template",
]
