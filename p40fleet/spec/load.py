"""Loading the spec: deep-merge ``stack_host`` over ``stack``, validate, cache per host.

pyinfra host data key ``stack`` (usually set in ``inventories/group_data/all.py``) is deep-merged
with host data key ``stack_host`` (per-host overrides, set in the inventory) and validated into a
frozen :class:`~p40fleet.spec.pins.StackSpec`; a bad spec raises :class:`SpecError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from p40fleet.spec.errors import SpecError, _problems_from
from p40fleet.spec.pins import StackSpec


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """A new dict: ``override`` over ``base``, recursing where both sides are dicts."""
    out: dict = {}
    for key, value in base.items():
        out[key] = deep_merge(value, {}) if isinstance(value, Mapping) else value
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = deep_merge(value, {})
        else:
            out[key] = value
    return out


def load_spec(
    host_name: str, stack: Mapping | None, stack_host: Mapping | None = None
) -> StackSpec:
    """Deep-merge ``stack_host`` over ``stack`` and validate; raise :class:`SpecError` if bad."""
    for key, data in (("stack", stack), ("stack_host", stack_host)):
        if data is not None and not isinstance(data, Mapping):
            raise SpecError(
                host_name,
                key,
                data,
                "expected a dict of stack settings (see inventories/group_data/all.py)",
            )
    merged = deep_merge(stack or {}, stack_host or {})
    try:
        return StackSpec.model_validate(merged)
    except ValidationError as exc:
        raise SpecError.from_problems(host_name, _problems_from(exc, merged, stack_host)) from None


_KNOWN_HOST_KEYS = ("stack", "stack_host")
_cache: dict[str, tuple[Any, Any, StackSpec]] = {}


def _distance(a: str, b: str) -> int:
    """Levenshtein distance of ``a`` and ``b`` (insertions, deletions, substitutions)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def stray_host_key(key: object) -> bool:
    """Whether host-data ``key`` looks meant as ``stack`` or ``stack_host`` but is neither
    (``Stack_host``, ``host_stack``, ``stack_hosts``, ``stak``): refused, never ignored."""
    if not isinstance(key, str) or key in _KNOWN_HOST_KEYS:
        return False
    folded = key.lower()
    return (
        "stack" in folded
        or _distance(folded, "stack") <= 1
        or _distance(folded, "stack_host") <= 2
        or sorted(re.split(r"[-_.]+", folded)) == ["host", "stack"]
    )


def _trust_anchor(path: tuple[str, ...], value: Any) -> bool:
    """What a ``stack_host`` may not change silently: the sums, commits and switches that
    decide what the host trusts, and ``mirror: None`` (security N13)."""
    return path[-1] in (
        "sha256",
        "commit",
        "signed_by",
        "trusted",
        "allow_unverified_host_keys",
    ) or (path == ("mirror",) and not isinstance(value, Mapping))


def trust_anchor_overrides(stack: Mapping | None, stack_host: Mapping | None) -> list[str]:
    """The trust anchors ``stack_host`` sets to a value other than ``stack``'s, as dotted
    fields (``torch.sha256``, ``policy.allow_unverified_host_keys``, ``mirror``), in order."""
    found: list[str] = []

    def walk(base: Any, over: Mapping, path: tuple[str, ...]) -> None:
        for key, value in over.items():
            here = (*path, str(key))
            had = base.get(key) if isinstance(base, Mapping) else None
            if _trust_anchor(here, value) and value != had:
                found.append(".".join(here))
            elif isinstance(value, Mapping):
                walk(had, value, here)

    if isinstance(stack_host, Mapping):
        walk(stack or {}, stack_host, ())
    return found


def spec_for_host(host: Any) -> StackSpec:
    """The validated spec of a pyinfra ``Host`` (cached per host name); raises SpecError."""
    data = host.data
    stack = data.get("stack")
    stack_host = data.get("stack_host")
    cached = _cache.get(host.name)
    if cached is not None and cached[0] == stack and cached[1] == stack_host:
        return cached[2]

    all_data = data.dict() if hasattr(data, "dict") else {}
    strays = [(key, all_data[key]) for key in sorted(all_data) if stray_host_key(key)]
    if strays:
        raise SpecError.from_problems(
            host.name,
            [
                (key, value, f"unknown host-data key {key!r} (allowed: stack, stack_host)")
                for key, value in strays
            ],
        )

    spec = load_spec(host.name, stack, stack_host)
    if spec.user.name == data.get("ssh_user"):
        raise SpecError(
            host.name,
            "stack.user.name",
            spec.user.name,
            "expected a training account other than ssh_user, the account p40fleet connects "
            "as (it has sudo; the training user runs code p40fleet does not vet)",
        )
    _cache[host.name] = (stack, stack_host, spec)
    return spec


def host_key_problem(host: Any, spec: StackSpec) -> SpecError | None:
    """The refusal for an SSH host that does not check its host key (None: it does, or is local).

    pyinfra's default is ``accept-new`` (the first key seen is trusted and stored), so a host
    list or an inventory that forgets ``ssh_strict_host_key_checking`` must not go unnoticed.
    """
    from pyinfra.connectors.ssh import SSHConnector  # pyinfra only where a host is given

    if not issubclass(host.connector_cls, SSHConnector) or spec.policy.allow_unverified_host_keys:
        return None
    value = host.data.get("ssh_strict_host_key_checking")
    if value == "yes":
        return None
    return SpecError(
        host.name,
        "ssh_strict_host_key_checking",
        value if value is not None else "accept-new (pyinfra's default)",
        "expected 'yes' (set it in the inventory's host data, with ssh_known_hosts_file naming "
        "the hosts' keys), or set stack.policy.allow_unverified_host_keys=True to accept it",
    )


def clear_spec_cache() -> None:
    _cache.clear()
