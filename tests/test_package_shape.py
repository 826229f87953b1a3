"""The package keeps small modules, and its callbacks sit where the import contracts say.

The callbacks (callbacks/, installed as ``skiptrain.callbacks``) are checked here rather than by import-linter alone:
the import graph reads them from the checkout as ``callbacks``, so it cannot see an import of ``skiptrain.callbacks``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 450


def _modules() -> list[Path]:
    return sorted(p for folder in ("skiptrain", "callbacks") for p in (ROOT / folder).rglob("*.py"))


def test_no_module_is_longer_than_450_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"modules longer than {MAX_LINES} lines (split them by job):\n" + "\n".join(long)


def test_only_the_cli_imports_the_callbacks():
    importers = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            if any(name == "skiptrain.callbacks" or name.startswith("skiptrain.callbacks.") for name in names):
                importers.append(path.relative_to(ROOT))
    assert importers, "the CLI adds the export callback: the scan must find its import"
    outside = [str(p) for p in importers if p.parts[:2] != ("skiptrain", "cli") and p.parts[0] != "callbacks"]
    assert not outside, f"only skiptrain/cli may import skiptrain.callbacks: {outside}"
