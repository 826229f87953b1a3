"""All-or-nothing outputs: refuse a used target, write beside it, move into place at the end.

Exports and calibration reports are written through :func:`staged_directory`: a temporary directory beside the
target, renamed into place only when the writer has finished (and verified) it, removed when it fails. A writer
killed half-way leaves only its staging directory, which the next writer to the same target clears. Single files
(conformance vectors, study scores and splits) go through :func:`write_whole`.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skiptrain.errors import UsageError


class OutputDirError(UsageError):
    """An output directory refused: a file, a non-empty directory without ``overwrite``, or one another process
    wrote while this one was writing it."""


def check_output_dir(output_dir: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse an output directory that exists and is not empty, unless ``overwrite``; refuse a file."""
    target = Path(output_dir)
    if target.exists() and not target.is_dir():
        raise OutputDirError(f"output_dir={str(target)!r} is a file, not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise OutputDirError(
            f"output_dir={str(target)!r} exists and is not empty: choose another directory or pass overwrite=True "
            "(--overwrite true) to replace it"
        )
    return target


def _staging_prefix(target: Path) -> str:
    """Name prefix of the staging directories beside ``target`` made on this host; the writer's pid follows it."""
    return f".{target.name}.tmp-{socket.gethostname()}-"


def remove_stale_staging(target: Path) -> list[Path]:
    """Remove staging directories beside ``target`` left by a writer killed on this host (its process is gone).

    Staging directories of running writers, or of other hosts (a shared file system), are left alone.

    Returns:
        The directories removed.
    """
    prefix, removed = _staging_prefix(target), []
    for staging in target.parent.glob(prefix + "*"):
        pid = staging.name[len(prefix):].split("-")[0]
        if pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _use_default_permissions(directory: Path) -> None:
    """Give a ``mkdtemp`` directory (created ``0700``) the permissions a plain ``mkdir`` would give it."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)


def _move_into_place(staging: Path, target: Path, overwrite: bool) -> None:
    """Rename the finished ``staging`` directory to ``target``, replacing an existing one only at the very end.

    Without ``overwrite`` the rename itself is the check: it fails when another writer reached ``target`` since
    :func:`check_output_dir` (an empty directory is removed first, which fails as well if it has been filled).
    """
    if not overwrite or not target.exists():
        try:
            if target.is_dir():
                target.rmdir()
            os.rename(staging, target)
        except OSError as err:
            raise OutputDirError(
                f"output_dir={str(target)!r} was written by another process while this one was writing it "
                f"({err.strerror}): it is kept as that process wrote it; choose another directory or pass "
                "overwrite=True (--overwrite true) to replace it"
            ) from err
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.replace(target, retired / target.name)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(retired / target.name, target)
        raise
    finally:
        shutil.rmtree(retired, ignore_errors=True)


@contextmanager
def staged_directory(target: Path, overwrite: bool = False) -> Iterator[Path]:
    """A temporary directory beside ``target`` to write into: moved into place when the block ends (replacing
    ``target`` only with ``overwrite``, see :func:`_move_into_place`), removed with everything in it when the block
    raises. Staging directories of killed writers are cleared first (:func:`remove_stale_staging`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(target)
    staging = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(target)}{os.getpid()}-", dir=target.parent))
    try:
        _use_default_permissions(staging)
        yield staging
        _move_into_place(staging, target, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_whole(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a staging file beside it: a writer stopped half-way leaves the old file (or
    none) and a hidden ``.NAME.partial``, never a half-written ``path``."""
    target = Path(path)
    staging = target.with_name(f".{target.name}.partial")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, target)
