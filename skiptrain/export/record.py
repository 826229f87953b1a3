"""The export record: everything an export states about the model and the run that produced it.

One typed record is written by :func:`~skiptrain.export.write.write_export`, read back by
:func:`~skiptrain.export.load.load_exported`, and assembled from a run by :mod:`skiptrain.training.runs`. On disk it is
spread over the export's files, whose formats are the export contract:

- ``skip_schedule.json``: the schedule (:meth:`~skiptrain.core.schedules.SkipSchedule.to_dict`) plus ``producer``,
  ``trained_with_schedule``, ``base_model`` (its Hub id where known: :attr:`ExportRecord.base_model_id`, with
  ``base_model_source`` naming the bundled model it was loaded from), ``base_quantization`` and, when known,
  ``checkpoint``
  (:class:`ExportedCheckpoint`), ``prompt_format`` (:class:`~skiptrain.shipped.prompt_format.PromptFormat`) and
  ``draft_vocab_size`` (:meth:`ExportRecord.schedule_json`);
- ``draft_vocab.json``: :attr:`ExportRecord.draft_vocab`, when recorded;
- ``training_config.yaml``: :attr:`ExportRecord.training_config`;
- ``README.md``: all of it, for people (task and validation metrics are written there only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from skiptrain.core.schedules import SkipSchedule
from skiptrain.modeling.loading import bundled_model
from skiptrain.shipped.draft_head import DRAFT_VOCAB_SIZE_KEY
from skiptrain.shipped.prompt_format import PromptFormat

NOT_RECORDED = "not recorded"


def producer() -> str:
    """``"skiptrain <version>"``, the ``producer`` of every export this installation writes."""
    try:
        return f"skiptrain {version('skiptrain')}"
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "skiptrain unknown"


Which = Literal["best", "last"]
"""Which weights of a fit run are exported: the checkpoint ``ModelCheckpoint(monitor=...)`` chose, or the last."""


@dataclass(frozen=True)
class ExportedCheckpoint:
    """Which weights of a run an export holds.

    Args:
        which: ``best``: the checkpoint ``ModelCheckpoint`` kept as best by ``monitor``; ``last``: the weights fit
            ended with.
        step: The optimizer step of those weights.
        monitor: The monitored metric (``best`` only).
        score: Its value at ``step`` (``best`` only).
    """

    which: Which
    step: int
    monitor: str | None = None
    score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``checkpoint`` object of ``skip_schedule.json``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ExportedCheckpoint | None:
        """The inverse of :meth:`to_dict`; ``None`` for an export that does not record it."""
        if not isinstance(data, Mapping) or data.get("which") not in ("best", "last"):
            return None
        score = data.get("score")
        return cls(data["which"], int(data.get("step") or 0), data.get("monitor"),
                   None if score is None else float(score))

    def describe(self) -> str:
        """One line for the model card."""
        if self.which == "best":
            return f"the best checkpoint by `{self.monitor}` ({self.score:.4g}), at step {self.step}"
        return f"the last weights of the run, at step {self.step}"


@dataclass(frozen=True)
class ExportRecord:
    """What an export records about its model and the run that produced it.

    Args:
        base_model: Model the fine-tuning started from, as skiptrain loads it (hub id, directory, ``.gguf`` file or
            bundled name); ``None`` only when read from a ``skip_schedule.json`` that does not name one.
        trained_with_schedule: Whether the weights were fine-tuned with the schedule in the forward pass.
        task: Task name of the run's data module, if known.
        training_config: YAML text of the resolved training config, if known.
        metrics: Validation metrics (name -> value).
        metrics_source: Where ``metrics`` came from, or ``not recorded``.
        schedule: The skip schedule; ``None`` until the record is attached to an export (``write_export`` sets
            it to the schedule it writes).
        producer: The skiptrain that wrote the export (``write_export`` sets it to this one).
        base_quantization: For a QLoRA run, the ``model.quantization`` settings of the base the adapters were
            trained on (``bits``, ``type``, ``double_quant``, ``compute_dtype``); ``None`` for a full-precision base.
        checkpoint: Which weights of the run were exported, when a fit run is known.
        prompt_format: How the run made prompts from sources, when it trained on prompt/target pairs: inference
            front-ends apply it to bare sources.
        draft_vocab: The token ids lossless speculative decoding drafts from (most frequent target tokens of the
            training data first), when recorded (:mod:`skiptrain.shipped.draft_head`).
    """

    base_model: str | None
    trained_with_schedule: bool = True
    task: str | None = None
    training_config: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_source: str = NOT_RECORDED
    schedule: SkipSchedule | None = None
    producer: str | None = field(default_factory=producer)
    base_quantization: dict[str, Any] | None = None
    checkpoint: ExportedCheckpoint | None = None
    prompt_format: PromptFormat | None = None
    draft_vocab: tuple[int, ...] | None = None

    @property
    def base_model_id(self) -> str | None:
        """The base model as the Hub knows it: a bundled name's Hub id (the bundled weights are a quantisation of
        that model), else :attr:`base_model` as it is."""
        bundled = bundled_model(self.base_model)
        return bundled.hub_id if bundled is not None else self.base_model

    def schedule_json(self) -> str:
        """The text of ``skip_schedule.json``: the schedule's keys, then ``producer``, ``trained_with_schedule``,
        ``base_model`` (:attr:`base_model_id`) and, when that is not the name skiptrain loads, ``base_model_source``
        (the bundled name)."""
        if self.schedule is None:
            raise ValueError("schedule=None is invalid for skip_schedule.json: allowed a SkipSchedule")
        extra: dict[str, Any] = {} if self.checkpoint is None else {"checkpoint": self.checkpoint.to_dict()}
        if self.base_model_id != self.base_model:
            extra["base_model_source"] = self.base_model
        if self.prompt_format is not None:
            extra["prompt_format"] = self.prompt_format.to_dict()
        if self.draft_vocab is not None:
            extra[DRAFT_VOCAB_SIZE_KEY] = len(self.draft_vocab)
        return self.schedule.to_json(producer=self.producer, trained_with_schedule=self.trained_with_schedule,
                                     base_model=self.base_model_id, base_quantization=self.base_quantization,
                                     **extra)

    @classmethod
    def from_schedule_file(
        cls, schedule: SkipSchedule, data: Mapping[str, Any], training_config: str | None = None,
        draft_vocab: tuple[int, ...] | None = None,
    ) -> ExportRecord:
        """The record of an export from its ``skip_schedule.json`` object (whose schedule is ``schedule``) and its
        ``draft_vocab.json`` ids.

        Task and metrics are not part of the machine-readable contract, so they come back unset.
        """
        return cls(
            base_model=data.get("base_model_source") or data.get("base_model"),
            trained_with_schedule=bool(data.get("trained_with_schedule")),
            training_config=training_config,
            schedule=schedule,
            producer=data.get("producer"),
            base_quantization=data.get("base_quantization"),
            checkpoint=ExportedCheckpoint.from_dict(data.get("checkpoint")),
            prompt_format=PromptFormat.from_dict(data["prompt_format"]) if data.get("prompt_format") else None,
            draft_vocab=draft_vocab,
        )


__all__ = ["NOT_RECORDED", "ExportRecord", "ExportedCheckpoint", "Which", "producer"]
