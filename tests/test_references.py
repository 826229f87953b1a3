"""Every dotted ``skiptrain.x.y`` name that the code's docstrings and comments or the docs point at exists, every
``benchmarks/...`` path and ``python -m benchmarks...`` module the project names exists, and the package's lazy public
names are the ones its ``TYPE_CHECKING`` block shows to type checkers.

A reference is a dotted name between backticks: ``:func:`~skiptrain.x.y``` or ````skiptrain.x.y```` in the Python
sources of skiptrain/, callbacks/ and benchmarks/, and ```skiptrain.x.y``` in README.md and docs/. It resolves when
the longest importable prefix imports and the rest is found by ``getattr`` (a module that needs an optional
dependency absent here, such as vLLM, is read instead: the attribute must be defined at its top level). A failure
lists every unresolved reference with its file and line.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

import skiptrain

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"`~?(skiptrain(?:\.[A-Za-z_]\w*)+)`")


def _sources() -> list[Path]:
    python = [p for folder in ("skiptrain", "callbacks", "benchmarks") for p in sorted((ROOT / folder).rglob("*.py"))
              if "results" not in p.relative_to(ROOT).parts]
    return python + [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def references() -> list[tuple[str, int, str]]:
    """``(file, line, dotted name)`` of every reference."""
    found = []
    for path in _sources():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            found += [(str(path.relative_to(ROOT)), number, name) for name in REFERENCE.findall(line)]
    return found


def _top_level_names(module: str) -> set[str]:
    """The names a module defines at its top level, read from its source without importing it."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return names


def unresolved(name: str) -> str | None:
    """Why ``name`` does not resolve, or None when it does."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:
            continue
        rest = parts[cut:]
        try:
            value = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name and error.name.split(".")[0] == "skiptrain":
                return f"importing {module} fails: {error}"
            # an optional dependency is absent: the first attribute must be defined in the module's source
            if rest and rest[0] not in _top_level_names(module):
                return f"{module} defines no {rest[0]}"
            return None
        for i, attribute in enumerate(rest):
            if not hasattr(value, attribute):
                return f"{'.'.join([module, *rest[:i]])} has no attribute {attribute}"
            value = getattr(value, attribute)
        return None
    return "no module of that name"


def test_the_reference_scan_finds_the_package_docstrings_and_the_docs():
    found = references()
    files = {file for file, _, _ in found}
    assert any(file.startswith("skiptrain/") for file in files)
    assert any(file.startswith("docs/") for file in files)
    assert unresolved("skiptrain.core.schedules.SkipDecode") is None
    assert unresolved("skiptrain.callbacks.predictions.PredictionWriter") is None
    assert unresolved("skiptrain.inference.generate_report") is not None
    assert unresolved("skiptrain.core.schedules.NoSuchSchedule") is not None


def test_every_skiptrain_reference_resolves():
    failures = sorted({f"{file}:{line}: {name} ({why})" for file, line, name in references()
                       if (why := unresolved(name)) is not None})
    assert not failures, f"{len(failures)} reference(s) that do not resolve:\n" + "\n".join(failures)


def test_the_type_checking_block_imports_every_lazy_name_from_its_module():
    tree = ast.parse((ROOT / "skiptrain/__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    shown = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    assert shown == skiptrain._LAZY


BENCHMARK_PATH = re.compile(r"(?<![\w/.])benchmarks/[\w./+-]*\w")
BENCHMARK_MODULE = re.compile(r"python -m (benchmarks(?:\.\w+)+)")
PLACEHOLDER = re.compile(r"[A-Z]{3,}|[$*{<]")  # STUDY, NAME, $study, *.yaml, {dev,test}, <family>


def test_every_benchmarks_path_and_module_the_project_names_exists():
    """Scripts, configs and modules under benchmarks/ named in docs, recipes, tests and scripts (outputs under
    benchmarks/results/ and paths with placeholders aside), so that a move leaves no stale command behind."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the project's files cannot be listed")
    missing = []
    for name in listed.split():
        if name.startswith("benchmarks/results/") or not re.search(r"\.(py|sh|md|yaml|env|toml)$", name):
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for target in BENCHMARK_PATH.findall(line):
                if not (target.startswith("benchmarks/results/") or PLACEHOLDER.search(target)
                        or (ROOT / target).exists()):
                    missing.append(f"{name}:{number}: {target}")
            missing += [f"{name}:{number}: python -m {module}" for module in BENCHMARK_MODULE.findall(line)
                        if importlib.util.find_spec(module) is None]
    assert not missing, f"{len(missing)} benchmark path(s) or module(s) that do not exist:\n" + "\n".join(missing)
