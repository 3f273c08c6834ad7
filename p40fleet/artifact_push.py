"""The controller's copy of an artifact, for ``stack.mirror.push_from_controller``.

Kept in ``$P40FLEET_CACHE/artifacts/FILENAME`` (``p40fleet.controller.cache_dir``): fetched
from the spec's URL (the mirror's ``artifacts_url``, else upstream) with the mirror builder's
checked download (``p40fleet.mirror.fetch``: ``.part``, resumed with an HTTP range, moved into
place only once its sha256 is the pin), or put there by hand on a controller that has the files
but no HTTP server to serve them. Either way its sha256 is checked before any host gets it; a
wrong one is refused, never uploaded. ``operations.artifacts.push`` asks for it once per run.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from p40fleet.controller import cache_dir, sha256_file
from p40fleet.mirror.fetch import FetchError, SumMismatch, fetch

__all__ = ["ARTIFACT_DIR", "PushError", "controller_artifact", "controller_copy"]

#: Under the controller cache: one file per artifact, by its pinned file name.
ARTIFACT_DIR = "artifacts"


class PushError(RuntimeError):
    """The controller has no verified copy to upload (the message names file, cause and fix)."""


def controller_artifact(filename: str) -> Path:
    """Where the controller keeps artifact ``filename``."""
    return cache_dir() / ARTIFACT_DIR / filename


def controller_copy(
    url: str,
    sha256: str,
    filename: str,
    size: int | None = None,
    *,
    download: Callable[..., int] | None = None,
) -> Path:
    """The controller's copy of ``filename``, its sha256 checked against ``sha256``: fetched
    from ``url`` first when absent (with ``download``, default :func:`p40fleet.mirror.fetch.fetch`).
    Raises :class:`PushError` (nothing to upload)."""
    sha256 = sha256.lower()
    path = controller_artifact(filename)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PushError(
                f"{filename}: another p40fleet run on this controller is fetching it (it holds "
                f"{path}.lock) — fix: wait for that run to finish, then re-run"
            ) from None
        if not path.is_file():
            _download(download or fetch, url, path, sha256, filename, size)
        got = sha256_file(path)
    if got != sha256:
        raise PushError(
            f"{filename}: the controller's copy {path} has sha256 {got}, expected {sha256}: "
            f"nothing uploaded — fix: delete {path} (the next run fetches it again from "
            f"{url}) or put the file with that sum there, or correct the sha256 in the stack "
            "spec, then re-run"
        )
    return path


def _download(
    download: Callable[..., int],
    url: str,
    path: Path,
    sha256: str,
    filename: str,
    size: int | None,
) -> None:
    try:
        download(url, path, sha256, size=size)
    except SumMismatch as exc:
        raise PushError(
            f"{filename} fetched by the controller from {url} has {exc.algorithm} {exc.got}, "
            f"expected {exc.want}: deleted, nothing uploaded — fix: check the source's copy "
            "(sha256sum it there) or correct the sha256 in the stack spec, then re-run"
        ) from None
    except FetchError as exc:
        part = f"{path}.part"
        kept = f" ({part} is kept: the next run resumes it)" if os.path.exists(part) else ""
        raise PushError(
            f"{filename}: the controller could not fetch it: {exc}{kept} — fix: make {url} "
            f"answer the controller, or put the file (sha256 {sha256}) at {path}, then re-run"
        ) from None
