"""The layering written in pyproject.toml's ``[tool.importlinter]`` contracts holds (deferred imports count)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter.cli", reason="import-linter is in the test extra")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_import_contracts_are_kept():
    # In a process of its own: import-linter configures logging with dictConfig, which disables every logger that
    # exists already (skiptrain's among them) for the rest of the process.
    lint = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(PYPROJECT)!r}, no_cache=True, no_logo=True))")
    done = subprocess.run([sys.executable, "-c", lint], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
