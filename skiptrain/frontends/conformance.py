"""Conformance test vectors for inference front-ends that apply a skip schedule, and the check of an engine's output.

:func:`write_vectors` decodes prompts greedily with the reference decoder
(:func:`~skiptrain.modeling.generation.generate_under_schedule`, exactly ``max_new_tokens`` tokens per prompt, no
end-of-sequence stop)
and records, per prompt, its token ids, the greedy tokens and the top logits of every step, next to the schedule they
were decoded under. An engine decodes the same prompt ids under the schedule and writes JSON lines ``{"id": ...,
"token_ids": [...]}``; :func:`check_outputs` compares them token by token and reports each case's first divergence. A
different token is a tie, and passes, when the reference's logit for it is within ``margin`` of the greedy token's: the
two were equally likely up to rounding, and the case stops being compared there, as the sequences now differ.
``docs/export-format.md`` tells an engine author how to use the kit (``skiptrain conformance``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from skiptrain.core.output_dir import write_whole
from skiptrain.core.schedules import Dense, SkipSchedule
from skiptrain.errors import InputError, UsageError
from skiptrain.export.format import SCHEDULE_FILE
from skiptrain.export.record import producer
from skiptrain.frontends.prompts import RAW, prompt_batches, prompt_text
from skiptrain.modeling.generation import generate_under_schedule
from skiptrain.shipped.prompt_format import PromptFormat, PromptSource

FORMAT = "skiptrain.conformance"
VERSION = 1
DEFAULT_TOP = 5
DEFAULT_MARGIN = 1e-3
"""Logit gap under which two tokens count as tied: fp32 engines agree with the reference to about 1e-5."""


class ConformanceError(InputError):
    """A vectors file or an engine's output file cannot be read (the message names the file and line)."""


def check_vector_options(top: int, margin: float | None) -> None:
    """Refuse ``top`` below 1 or a negative ``margin`` (before the model is loaded to write vectors)."""
    if top < 1:
        raise UsageError(f"top={top} is invalid: allowed >= 1")
    if margin is not None and not margin >= 0:
        raise UsageError(f"margin={margin} is invalid: allowed >= 0 (a logit gap)")


@torch.no_grad()
def write_vectors(
    model: nn.Module,
    tokenizer: Any,
    schedule: SkipSchedule,
    prompts: Sequence[PromptSource],
    path: str | os.PathLike,
    max_new_tokens: int,
    batch_size: int = 8,
    top: int = DEFAULT_TOP,
    margin: float = DEFAULT_MARGIN,
    device: torch.device | str = "cpu",
    context: Callable[[], AbstractContextManager] = nullcontext,
    lossless: bool = False,
    prompt_format: PromptFormat = RAW,
) -> dict[str, Any]:
    """Decode ``prompts`` with the reference decoder and write the test vectors to ``path`` (one JSON object).

    The prompts are made by ``prompt_format`` (an export's recorded format, or raw), so each case's
    ``prompt_token_ids`` are what training made from that source. With ``lossless``, the reference decodes at full
    depth: vectors for a speculative implementation that drafts under ``schedule``, whose output must be the
    full-depth output.

    Returns:
        The written object: ``format``, ``version``, ``producer``, ``skip_schedule`` (the schedule's layer lists),
        ``reference`` (``"schedule"``, or ``"full_depth"`` with ``lossless``), ``max_new_tokens``, ``margin``, and
        ``cases``, each with ``id``, ``prompt``, ``prompt_token_ids``, ``token_ids`` and ``top_logits`` (per step,
        ``top`` pairs ``[token_id, logit]``, best first).
    """
    check_vector_options(top, margin)
    cases: list[dict[str, Any]] = []
    reference = Dense().build(schedule.num_layers) if lossless else schedule
    for batch in prompt_batches(tokenizer, prompts, batch_size, prompt_format):
        ids, mask = batch["prompt_input_ids"].to(device), batch["prompt_attention_mask"].to(device)
        with context():
            out = generate_under_schedule(model, ids, mask, reference, max_new_tokens=max_new_tokens,
                                          pad_token_id=tokenizer.pad_token_id, return_logits=True)
        best = out.logits.float().topk(min(top, out.logits.shape[-1]), dim=-1)  # [B, G, top]
        for row in range(ids.shape[0]):
            case = len(cases)
            cases.append({
                "id": case,
                "prompt": prompt_text(prompts[case]),
                "prompt_token_ids": ids[row][mask[row].bool()].tolist(),
                "token_ids": out.tokens[row].tolist(),
                "top_logits": [[[t, v] for t, v in zip(tokens, values, strict=True)]
                               for tokens, values in zip(best.indices[row].tolist(), best.values[row].tolist(),
                                                         strict=True)],
            })
    vectors = {"format": FORMAT, "version": VERSION, "producer": producer(), "skip_schedule": schedule.to_dict(),
               "reference": "full_depth" if lossless else "schedule", "max_new_tokens": max_new_tokens,
               "margin": margin, "cases": cases}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_whole(target, json.dumps(vectors) + "\n")
    return vectors


def _read_text(path: str | os.PathLike, option: str, expected: str) -> str:
    """The UTF-8 text of the file given as ``option``; refused in one line when it is missing or unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise ConformanceError(f"{option}={str(path)!r}: no such file: allowed {expected}") from err
    except (OSError, UnicodeDecodeError) as err:
        raise ConformanceError(f"{option}={str(path)!r} cannot be read as UTF-8 text ({err}): allowed "
                               f"{expected}") from err


def read_vectors(path: str | os.PathLike, schedule: SkipSchedule | None = None) -> dict[str, Any]:
    """A vectors file written by :func:`write_vectors`; with ``schedule`` (an export's), checked to hold it.

    Raises:
        ConformanceError: naming the file when it is not JSON, not of this format and version, or written for
            another schedule than ``schedule``.
    """
    try:
        vectors = json.loads(_read_text(path, "vectors", "a vectors file written by `skiptrain conformance`"))
    except json.JSONDecodeError as err:
        raise ConformanceError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(vectors, dict) or vectors.get("format") != FORMAT or vectors.get("version") != VERSION:
        raise ConformanceError(f"{path} is not a conformance vectors file: allowed format={FORMAT!r}, "
                               f"version={VERSION} (write one with `skiptrain conformance`)")
    if schedule is not None and SkipSchedule.from_dict(vectors["skip_schedule"]) != schedule:
        raise ConformanceError(f"{path} was written for another schedule than the export's {SCHEDULE_FILE}: "
                               "allowed only vectors of the export under test")
    return vectors


def read_outputs(path: str | os.PathLike) -> dict[int, list[int]]:
    """An engine's JSON-lines output: ``{"id": case id, "token_ids": [generated ids]}`` per line.

    Raises:
        ConformanceError: naming the line of a malformed or repeated entry.
    """
    outputs: dict[int, list[int]] = {}
    text = _read_text(path, "check", "the engine's JSON-lines output")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConformanceError(f"{path} line {number}: not valid JSON: {err}") from err
        ok = isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("token_ids"), list)
        if not ok or entry["id"] in outputs:
            raise ConformanceError(f"{path} line {number}: allowed one object per case with an integer 'id' and a "
                                   "'token_ids' list")
        outputs[entry["id"]] = entry["token_ids"]
    return outputs


@dataclass(frozen=True)
class Divergence:
    """Where an engine's tokens first leave the reference in one case."""

    case: int
    step: int
    """Generated index ``g`` of the first differing token."""
    expected: int | None
    got: int | None
    """The engine's token, ``None`` when its output ended (or the case is missing)."""
    gap: float | None
    """Reference logit of the expected token minus that of the engine's token; ``None`` if outside the top list."""

    def describe(self) -> str:
        if self.got is None:
            return f"case {self.case}: the engine's output ends before generated index {self.step}"
        gap = "it is not among the reference's top logits" if self.gap is None else (
            f"its reference logit is {self.gap:.3g} below the greedy token's")
        return (f"case {self.case}, generated index {self.step}: expected token {self.expected}, got {self.got} "
                f"({gap})")


@dataclass(frozen=True)
class ConformanceReport:
    """The result of :func:`check_outputs`."""

    cases: int
    ties: tuple[Divergence, ...]
    """Differing tokens within the margin (passes): the case is compared up to there."""
    failures: tuple[Divergence, ...]
    margin: float

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        lines = [f"conformance {verdict}: {self.cases - len(self.failures)} of {self.cases} cases agree with the "
                 f"reference ({len(self.ties)} of them up to a tie within {self.margin:g})"]
        if self.failures:
            lines.append("first divergence: " + self.failures[0].describe())
        return "\n".join(lines)


def _first_divergence(case: dict[str, Any], got: list[int], margin: float) -> tuple[Divergence | None, bool]:
    """``(divergence, is_tie)`` of one case; ``(None, False)`` when every token agrees."""
    for step, expected in enumerate(case["token_ids"]):
        if step >= len(got):
            return Divergence(case["id"], step, expected, None, None), False
        if got[step] == expected:
            continue
        logits = {token: value for token, value in case["top_logits"][step]}
        gap = logits[expected] - logits[got[step]] if got[step] in logits else None
        return Divergence(case["id"], step, expected, got[step], gap), gap is not None and gap <= margin
    return None, False


def check_outputs(vectors: dict[str, Any], outputs: dict[int, list[int]], margin: float | None = None
                  ) -> ConformanceReport:
    """Compare an engine's generated tokens with the vectors' greedy tokens, case by case.

    Args:
        vectors: From :func:`read_vectors`.
        outputs: Case id -> the engine's generated token ids (:func:`read_outputs`); tokens past ``max_new_tokens``
            are ignored, a missing case fails.
        margin: Logit gap that counts as a tie; default the vectors' ``margin``.
    """
    margin = vectors["margin"] if margin is None else margin
    ties, failures = [], []
    for case in vectors["cases"]:
        divergence, tie = _first_divergence(case, outputs.get(case["id"], []), margin)
        if divergence is not None:
            (ties if tie else failures).append(divergence)
    return ConformanceReport(len(vectors["cases"]), tuple(ties), tuple(failures), margin)


__all__ = [
    "ConformanceError",
    "ConformanceReport",
    "Divergence",
    "check_outputs",
    "check_vector_options",
    "read_outputs",
    "read_vectors",
    "write_vectors",
]
