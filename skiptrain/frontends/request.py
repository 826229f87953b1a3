"""One ``skiptrain generate`` request: which prompts, how many tokens, how they are chosen, and speculation.

:class:`GenerationRequest` is built once where the user's options arrive (the command line, or a caller of
:func:`~skiptrain.frontends.inference.generate_report`) and checked there, every field at once, before any weights
load; the decode driver and the speed report take it as it is.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from skiptrain.errors import InputError, UsageError
from skiptrain.export.format import read_draft_vocab
from skiptrain.frontends.prompts import LONG_PROMPTS, STDIO, LongPrompts
from skiptrain.frontends.speculative import check_draft_levers, check_draft_tokens, check_speculative_sampling
from skiptrain.modeling.generation import SamplingConfig

DEFAULT_MAX_NEW_TOKENS = 64
"""Tokens per prompt when neither ``--max_new_tokens`` nor the model's ``generation.max_new_tokens`` says."""


@dataclass(frozen=True)
class GenerationRequest:
    """What ``skiptrain generate`` decodes, and how; refused in one line naming the field when it cannot be met.

    Args:
        max_new_tokens: Tokens generated per prompt at most (>= 1).
        batch_size: Prompts decoded together (>= 1).
        sampling: How each token is chosen (greedy by default).
        dense: Decode with every layer, ignoring the schedule.
        compare_dense: Also time the prompts densely at equal work and report the measured speedup.
        long_prompts: A prompt that leaves no room for ``max_new_tokens`` is refused, or truncated with a warning.
        speculative: K >= 1 drafts K tokens per full-depth verification (lossless); 0 decodes under the schedule.
        draft_schedule: With ``speculative``, a schedule file to draft under instead of the model's own.
        draft_vocab: With ``speculative``, a draft vocabulary file (``draft_vocab.json``: token ids) whose head rows
            alone the drafts score, instead of the export's recorded one (if any).
        draft_confidence: With ``speculative``, a row stops proposing drafts in a round after one less probable than
            this (0 <= x < 1; 0 turns it off).
        raw_prompts: Use each prompt as it is, not as a source of the recorded prompt format.
        prompts: A prompts file, or ``-`` for stdin.
        prompt: One prompt from the command line instead of ``prompts``, streamed as it is generated.
        stop: Strings that end a completion once generated (it keeps them, as transformers' ``stop_strings`` do).
        output: Where the JSON lines go (``-``: stdout; with ``prompt``, the streamed text goes there instead).
    """

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch_size: int = 8
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    dense: bool = False
    compare_dense: bool = False
    long_prompts: LongPrompts = "refuse"
    speculative: int = 0
    draft_schedule: str | None = None
    draft_vocab: str | None = None
    draft_confidence: float = 0.0
    raw_prompts: bool = False
    prompts: str = STDIO
    prompt: str | None = None
    stop: tuple[str, ...] = ()
    output: str = STDIO

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        if self.max_new_tokens < 1:
            raise UsageError(f"max_new_tokens={self.max_new_tokens} is invalid: allowed >= 1")
        if self.batch_size < 1:
            raise UsageError(f"batch_size={self.batch_size} is invalid: allowed >= 1")
        if self.long_prompts not in LONG_PROMPTS:
            raise UsageError(f"long_prompts={self.long_prompts!r} is invalid: allowed one of {list(LONG_PROMPTS)}")
        self._check_speculation()
        if self.prompt is not None and self.prompts != STDIO:
            raise UsageError(f"prompt={self.prompt!r} is invalid with prompts={self.prompts!r}: allowed one of them")
        if self.prompt is not None and not self.prompt.strip():
            raise UsageError("prompt='' is invalid: allowed a non-empty prompt")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise UsageError(f"stop={list(self.stop)} is invalid: allowed non-empty strings")

    def with_draft_vocab(self, vocab_size: int, recorded: str | os.PathLike | None = None) -> GenerationRequest:
        """This request drafting over its ``draft_vocab`` file, checked against the model's ``vocab_size``, else
        over the model's ``recorded`` draft vocabulary file (an export's ``draft_vocab.json``) when it has one.

        Raises:
            InputError: naming the file when it does not hold distinct token ids of the vocabulary.
        """
        if self.draft_vocab is not None:
            read_draft_vocab(self.draft_vocab, vocab_size)
        elif recorded is not None and self.speculative:
            return dataclasses.replace(self, draft_vocab=str(recorded))
        return self

    def _check_speculation(self) -> None:
        check_draft_tokens(self.speculative, self.max_new_tokens)
        check_draft_levers(None, self.draft_confidence, 0)
        if not self.speculative:
            for name in ("draft_schedule", "draft_vocab", "draft_confidence"):
                if getattr(self, name):
                    raise UsageError(f"{name}={getattr(self, name)!r} is invalid without speculative: allowed with "
                                     "--speculative K >= 1")
            return
        if self.dense:
            raise UsageError(f"dense=true is invalid with speculative={self.speculative}: speculative output is "
                             "already the full-depth output; allowed one of them")
        check_speculative_sampling(self.sampling)
        if self.stop:
            raise UsageError(f"stop={list(self.stop)} is invalid with speculative={self.speculative}: allowed "
                             "without speculation")
        if self.draft_schedule is not None and not Path(self.draft_schedule).is_file():
            raise InputError(f"draft_schedule={self.draft_schedule!r}: no such file; give a skip_schedule.json or a "
                             "schedule YAML (class_path/init_args)")
        if self.draft_vocab is not None and not Path(self.draft_vocab).is_file():
            raise InputError(f"draft_vocab={self.draft_vocab!r}: no such file; give a draft_vocab.json (a JSON list "
                             "of token ids)")


__all__ = ["DEFAULT_MAX_NEW_TOKENS", "GenerationRequest"]
