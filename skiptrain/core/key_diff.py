"""Compare the tensor names and shapes a set of weights has with those an architecture expects.

One report for every place that checks weights against a model: the export's saved safetensors and adapters
(:mod:`skiptrain.export.verify`) and consolidated training checkpoints (:mod:`skiptrain.training.checkpoints`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Shapes = Mapping[str, Sequence[int]]
"""Tensor name -> shape."""


@dataclass(frozen=True)
class KeyDiff:
    """How found tensors differ from expected ones; every entry is sorted.

    Attributes:
        missing: Expected names that were not found (optional ones excepted).
        unexpected: Found names the architecture does not have.
        empty: Found zero-element tensors where the architecture expects elements (unsharded placeholders).
        misshaped: ``"name: [found] instead of [expected]"`` for the other names whose shapes differ.
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    empty: tuple[str, ...] = ()
    misshaped: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """One phrase per kind of difference, e.g. ``"2 missing: a.weight, b.weight"``; empty when they agree."""
        kinds = (("missing", self.missing), ("unexpected", self.unexpected), ("empty (zero-element)", self.empty),
                 ("of the wrong shape", self.misshaped))
        return [f"{len(names)} {label}: {list_names(names)}" for label, names in kinds if names]


def diff_keys(found: Shapes, expected: Shapes, optional: frozenset[str] | set[str] = frozenset()) -> KeyDiff:
    """Compare ``found`` tensors with ``expected`` ones by name and shape.

    Args:
        found: Name -> shape of the tensors at hand.
        expected: Name -> shape the architecture needs.
        optional: Expected names that may be absent (tied copies that ``save_pretrained`` leaves out).
    """
    found = {k: tuple(v) for k, v in found.items()}
    expected = {k: tuple(v) for k, v in expected.items()}
    empty = {k for k, s in found.items() if math.prod(s) == 0 and math.prod(expected.get(k, s)) != 0}
    return KeyDiff(
        missing=tuple(sorted(set(expected) - set(found) - set(optional))),
        unexpected=tuple(sorted(set(found) - set(expected))),
        empty=tuple(sorted(empty)),
        misshaped=tuple(sorted(f"{k}: {list(found[k])} instead of {list(expected[k])}"
                               for k in set(found) & set(expected) if found[k] != expected[k] and k not in empty)),
    )


def list_names(names: Sequence[str], limit: int = 20) -> str:
    """``names`` joined by commas, the first ``limit`` of them and a count of the rest."""
    names = list(names)
    return ", ".join(names[:limit]) + (f" ... ({len(names) - limit} more)" if len(names) > limit else "")


__all__ = ["KeyDiff", "Shapes", "diff_keys", "list_names"]
