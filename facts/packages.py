"""dpkg's state of named packages (``dpkg-query -W``), so an operation decides per package.

The command exits 0 on any host: a package dpkg has never heard of is simply absent from the
answer (``dpkg-query`` then says so on stderr and exits 1, both swallowed).
"""

from __future__ import annotations

import re

from pyinfra.api import FactBase, QuoteString, StringCommand
from typing_extensions import override

from p40fleet.jsonable import NameSet

__all__ = ["DebInstalled", "PACKAGE_NAME"]

#: A Debian package name (Debian Policy 5.6.7): what may be asked, nothing a shell could read.
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9.+-]+")
#: ``${db:Status-Abbrev}`` of a package that is fully installed (desired install, installed).
INSTALLED = "ii"


class DebInstalled(FactBase[NameSet]):
    """
    Returns the subset of ``packages`` that dpkg reports fully installed (status ``ii``);
    removed-but-configured (``rc``), half-installed or unknown packages are not in it.
    """

    @staticmethod
    @override
    def default() -> NameSet:
        return NameSet()

    @override
    def requires_command(self, packages: tuple[str, ...] = ()) -> str:
        del packages
        return "dpkg-query"

    @override
    def command(self, packages: tuple[str, ...] = ()) -> StringCommand:
        for name in packages:
            if not PACKAGE_NAME.fullmatch(name):
                raise ValueError(f"not a Debian package name: {name!r}")
        return StringCommand(
            "dpkg-query -W -f",
            QuoteString("${Package} ${db:Status-Abbrev}\\n"),
            "--",
            *(QuoteString(name) for name in packages),
            "2>/dev/null || true",
        )

    @override
    def process(self, output: list[str]) -> NameSet:
        found = set()
        for line in output:
            words = line.split()
            if len(words) >= 2 and words[1].startswith(INSTALLED):
                found.add(words[0])
        return NameSet(found)  # a frozenset pyinfra's CLI can write
