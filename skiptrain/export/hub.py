"""Publish an export on the Hugging Face Hub with huggingface_hub's own upload (``skiptrain export --push_to_hub``).

The repository is created if needed and the whole export directory is uploaded in one commit by
``HfApi.upload_folder``; credentials are huggingface_hub's (``hf auth login`` or ``HF_TOKEN``).
"""

from __future__ import annotations

import os

import huggingface_hub
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from huggingface_hub.utils import validate_repo_id

from skiptrain.errors import InputError, UsageError


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


__all__ = ["check_can_push", "push_export"]
