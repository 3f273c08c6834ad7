"""Facts about verl on the training user's side: the git checkout and whether its patches are in.

Like the env facts (``facts.env``), each runs as the training user, exits 0 whatever it
finds and encodes the state in its output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

# one marker and one way to run as the training user for all of that user's facts
from p40fleet.facts.env import _MARK, _MISSING, MarkerText, _as
from p40fleet.jsonable import ToJson

__all__ = [
    "GitCheckout",
    "GitState",
    "VerlPatchCheck",
]

#: Lines of ``git status`` a fact keeps (the names it reports are for a message).
STATUS_LINES = 200


@dataclass(frozen=True)
class GitState(ToJson):
    """A git checkout: whether it exists, its HEAD, origin URL and locally modified files."""

    exists: bool
    is_repo: bool = False
    head: str | None = None
    origin: str | None = None
    modified: tuple[str, ...] = field(default_factory=tuple)


class GitCheckout(FactBase[GitState]):
    """
    Returns the ``GitState`` of a checkout (HEAD, ``origin`` URL, ``git status`` paths).
    """

    @staticmethod
    @override
    def default() -> GitState:
        return GitState(exists=False)

    @override
    def command(self, path: str, user: str) -> str:
        q = QuoteString(path)
        # As the training user, the checkout's owner: no safe.directory override, so git never
        # honours a repo config of someone else's (core.fsmonitor runs a command). No optional
        # locks: a fact never writes, and ``git status`` would refresh .git/index (a --dry run
        # changed the checkout's files, as the verify probe's own git call already avoids).
        git = StringCommand("git --no-optional-locks -C", q)
        return _as(user, StringCommand(
            "if [ ! -e",
            q,
            f"]; then echo '{_MARK} missing';",
            "elif head=$(",
            git,
            "rev-parse --verify -q HEAD 2>/dev/null); then",
            f'echo "{_MARK} head $head";',
            f'echo "{_MARK} origin $(',
            git,
            'config --get remote.origin.url)";',
            git,
            f"status --porcelain --untracked-files=no 2>/dev/null | head -n {STATUS_LINES};",
            f"else echo '{_MARK} not-a-repo'; fi; true",
        ), _MISSING)  # fmt: skip

    @override
    def process(self, output: list[str]) -> GitState:
        head = origin = None
        modified: list[str] = []
        is_repo = False
        for line in output:
            if line.startswith(_MARK):
                words = line[len(_MARK) :].split(None, 1)
                kind = words[0] if words else ""
                value = words[1].strip() if len(words) > 1 else None
                if kind == "missing":
                    return GitState(exists=False)
                if kind == "not-a-repo":
                    return GitState(exists=True, is_repo=False)
                if kind == "head":
                    is_repo, head = True, value
                elif kind == "origin":
                    origin = value
            elif len(line) > 3 and line.strip():
                # porcelain v1: "XY path" (renames: "old -> new")
                modified.append(line[3:].split(" -> ")[-1].strip())
        return GitState(True, is_repo, head, origin, tuple(modified))


class VerlPatchCheck(MarkerText):
    """
    Returns the applier's ``--check`` exit code as text (``"100"`` = in sync), or ``None``
    when the applier or this rule set is not on the host yet.
    """

    @override
    def command(self, python: str, script: str, rules: str, checkout: str, user: str) -> str:
        return _as(user, StringCommand(
            "if [ -x",
            QuoteString(python),
            "] && [ -f",
            QuoteString(script),
            "] && [ -f",
            QuoteString(rules),
            "] && [ -d",
            QuoteString(checkout),
            "]; then echo '##p40fleet file';",
            QuoteString(python),
            QuoteString(script),
            "--rules",
            QuoteString(rules),
            "--checkout",
            QuoteString(checkout),
            "--check >/dev/null 2>&1; echo $?; fi; true",
        ))  # fmt: skip
