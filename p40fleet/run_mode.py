"""Which of pyinfra's run modes the deploys support.

pyinfra runs each operation on every host before the next one starts, unless ``--no-wait``
(every host then runs all its operations at its own pace, pyinfra's ``run_ops(no_wait=True)``).
The Apex wheel is built on one host and fetched by the others at the next operation
(``operations/run/apex_fleet.py``): under ``--no-wait`` a host would look for the wheel before its
builder made it. ``--serial`` (host by host, in inventory order: the builder first) and
``--parallel N`` (batches, still waiting at each operation) keep that order. pyinfra 3's
``--no-wait`` also exits 0 after a failed operation (the failing greenlet's error is not
counted: seen with a refusal here), so a refused host would look provisioned to a script.

pyinfra passes the flag to ``run_ops`` only; the command line is the one place a deploy can
read it (click takes no abbreviations of long options).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["NO_WAIT_REMEDY", "NO_WAIT_STEP", "no_wait_refusal"]

NO_WAIT_STEP = "run mode"
NO_WAIT_REMEDY = (
    "run without --no-wait (--parallel N bounds how many hosts run an operation at once; "
    "--serial goes host by host)"
)


def no_wait_refusal(argv: Sequence[str] | None = None) -> str | None:
    """Why this run cannot provision (``--no-wait`` on pyinfra's command line), or None."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        args = args[: args.index("--")]
    if "--no-wait" not in args:
        return None
    return (
        "pyinfra --no-wait runs every host at its own pace, but the Apex wheel is built on one "
        "host and fetched by the others at the next operation: they would look for it before "
        "it exists"
    )
