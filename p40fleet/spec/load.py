"""Loading the spec: deep-merge ``stack_host`` over ``stack``, validate, cache per host.

pyinfra host data key ``stack`` (usually set in ``inventories/group_data/all.py``) is deep-merged
with host data key ``stack_host`` (per-host overrides, set in the inventory) and validated into a
frozen :class:`~p40fleet.spec.pins.StackSpec`; a bad spec raises :class:`SpecError`.
"""

from __future__ import annotations

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


def spec_for_host(host: Any) -> StackSpec:
    """The validated spec of a pyinfra ``Host`` (cached per host name); raises SpecError."""
    data = host.data
    stack = data.get("stack")
    stack_host = data.get("stack_host")
    cached = _cache.get(host.name)
    if cached is not None and cached[0] == stack and cached[1] == stack_host:
        return cached[2]

    all_data = data.dict() if hasattr(data, "dict") else {}
    strays = [
        (key, all_data[key])
        for key in sorted(all_data)
        if isinstance(key, str) and key.startswith("stack") and key not in _KNOWN_HOST_KEYS
    ]
    if strays:
        raise SpecError.from_problems(
            host.name,
            [
                (key, value, f"unknown host-data key {key!r} (allowed: stack, stack_host)")
                for key, value in strays
            ],
        )

    spec = load_spec(host.name, stack, stack_host)
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
