"""Exports on the Hugging Face Hub, through huggingface_hub's own upload, download and cache.

``skiptrain export --push_to_hub`` creates the repository if needed and uploads the whole export directory in one
commit (``HfApi.upload_folder``); credentials are huggingface_hub's (``hf auth login`` or ``HF_TOKEN``).
:func:`hub_export` turns the repository id of an export back into a local directory: ``snapshot_download`` fetches it
into huggingface_hub's cache, or finds it there offline.
"""

from __future__ import annotations

import os
from pathlib import Path

import huggingface_hub
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, HFValidationError, LocalEntryNotFoundError
from huggingface_hub.utils import validate_repo_id

from skiptrain.errors import InputError, ModelError, UsageError
from skiptrain.export.format import SCHEDULE_FILE
from skiptrain.modeling.loading import bundled_model, not_cached_offline


def hub_export(name: str | os.PathLike, required: bool = False) -> Path | None:
    """The local copy of the Hub model repository ``name`` when it is a skiptrain export (it has
    ``skip_schedule.json``): downloaded into huggingface_hub's cache by ``snapshot_download``, or found there offline.

    Args:
        name: A model name or path.
        required: Refuse a repository the cache lacks while the Hub cannot be reached, rather than return ``None``
            (whoever loads ``name`` as a pretrained model then refuses it with the same words).

    Returns:
        The snapshot directory; ``None`` for an existing local path, a name that is no repository id (a ``.gguf``
        file, a bundled name), or a repository that is not an export (a plain model, loaded as one, or an unknown
        id, which loading then names).

    Raises:
        ModelError: in one line, with ``required`` when the Hub cannot be reached (``HF_HUB_OFFLINE=1`` or no
            network) and the repository is not in the cache; or when the download fails.
    """
    name = str(name)
    if Path(name).expanduser().exists() or name.endswith(".gguf") or bundled_model(name) is not None:
        return None
    try:
        validate_repo_id(name)
        hf_hub_download(name, SCHEDULE_FILE)  # from the cache when the Hub cannot be reached
    except LocalEntryNotFoundError as err:  # the Hub cannot be reached, and the file is not in the cache
        if not required or _cached_snapshot(name) is not None:
            return None  # a plain model in the cache (an export's snapshot holds its skip_schedule.json), or unknown
        offline = huggingface_hub.is_offline_mode()
        raise not_cached_offline(name, "the hub is offline (HF_HUB_OFFLINE=1)" if offline else
                                 "the Hugging Face Hub cannot be reached") from err
    except (EntryNotFoundError, HfHubHTTPError, HFValidationError):
        return None  # not an export, or no repository at all
    try:
        return Path(snapshot_download(name))
    except (HfHubHTTPError, OSError) as err:
        reason = " ".join(str(err).split())
        raise ModelError(f"model={name!r} is an export on the Hugging Face Hub that could not be downloaded "
                         f"({reason}): check your connection and try again") from err


def _cached_snapshot(repo_id: str) -> str | None:
    """The cached snapshot of ``repo_id`` at its default revision, or ``None``."""
    try:
        return snapshot_download(repo_id, local_files_only=True)
    except (LocalEntryNotFoundError, OSError):
        return None


def check_can_push(repo_id: str) -> None:
    """Refuse a push before any work: an invalid repository id, or huggingface_hub in offline mode.

    Raises:
        UsageError: naming ``push_to_hub`` and what to change.
    """
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise UsageError(f"push_to_hub={repo_id!r} is invalid: allowed a Hub repository id such as "
                         f"'user/model' ({err})") from err
    if huggingface_hub.is_offline_mode():
        raise UsageError(f"push_to_hub={repo_id!r} cannot be used offline: HF_HUB_OFFLINE is set; unset it to "
                         "upload, or leave push_to_hub out and upload the export directory later")


def push_export(directory: str | os.PathLike, repo_id: str, private: bool | None = None) -> str:
    """Upload an export directory to the Hub model repository ``repo_id`` (created when absent).

    Args:
        directory: The export directory.
        repo_id: ``user/model`` or ``org/model``.
        private: Visibility of a repository created here (``None``: the Hub's default); an existing one keeps its own.

    Returns:
        The URL of the commit.

    Raises:
        UsageError: as :func:`check_can_push`.
        InputError: when the Hub refuses the upload (e.g. no credentials or no write access), with its reason.
    """
    check_can_push(repo_id)
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=str(directory),
                                   commit_message="Upload skiptrain export")
    except HfHubHTTPError as err:
        reason = " ".join(str(err).split())
        raise InputError(f"push_to_hub={repo_id!r}: the Hub refused the upload ({reason}); log in with "
                         "`hf auth login` or set HF_TOKEN to a token with write access") from err
    return commit.commit_url


__all__ = ["check_can_push", "hub_export", "push_export"]
