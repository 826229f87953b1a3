"""The layering written in pyproject.toml's ``[tool.importlinter]`` contracts holds (deferred imports count)."""

from pathlib import Path

import pytest

importlinter_cli = pytest.importorskip("importlinter.cli", reason="import-linter is in the test extra")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_import_contracts_are_kept():
    assert importlinter_cli.lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True) == 0
