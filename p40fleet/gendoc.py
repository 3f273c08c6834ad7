"""The generated documents' shared parts: a markdown table cell, and the ``--write`` CLI.

    python -m p40fleet.spec.table [--write]    # docs/settings.md
    python -m p40fleet.footprint [--write]     # docs/footprint.md
    python -m p40fleet.pictures [--write]      # docs/pictures/*.svg

Without ``--write`` the text goes to stdout; a test per document keeps the committed file
equal to what its ``render`` makes now.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["cell", "main"]


def cell(text: str) -> str:
    """``text`` as one cell of a markdown table (its ``|`` escaped)."""
    return text.replace("|", "\\|")


def main(prog: str, documents: Callable[[], Mapping[Path, str]],
         argv: Sequence[str] | None = None) -> int:  # fmt: skip
    """Write ``documents()`` (path -> text) with ``--write``, else print them; 2 on other args."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--write"]):
        print(f"usage: python -m {prog} [--write]", file=sys.stderr)
        return 2
    for path, text in documents().items():
        if args:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        else:
            sys.stdout.write(text)
    return 0
