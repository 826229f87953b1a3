"""Running the CLI in-process in tests: its exit code and stderr, its one-line errors, and what it wrote."""

from __future__ import annotations

from pathlib import Path

from skiptrain.cli.app import main


def snapshot(folder: Path) -> dict[str, int]:
    """Every path under ``folder`` with its size (-1 for a directory)."""
    return {str(p.relative_to(folder)): -1 if p.is_dir() else p.stat().st_size for p in folder.rglob("*")}


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """Run the CLI in-process; its exit code and stderr."""
    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    return code, capsys.readouterr().err


def error_lines(stderr: str) -> list[str]:
    """The ``skiptrain <subcommand>: error: ...`` lines of ``stderr``."""
    return [line for line in stderr.splitlines() if line.startswith(("skiptrain ", "error: ")) and "error: " in line]
