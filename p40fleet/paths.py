"""Where the project's ``files/`` are (templates, hash-locked requirement files, the verl patch
applier): beside the package when it is installed (``p40fleet/files``, package data), else the
checkout's ``files/`` (an editable install, or a run from the checkout); and the checkout this
package sits in (``REPO``: deploys, inventories, docs), for every CLI and tool that needs it."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parent
FILES = PACKAGE / "files" if (PACKAGE / "files").is_dir() else REPO / "files"
