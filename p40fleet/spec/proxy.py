"""``stack.proxy``: the HTTP proxy every fetching step goes through (optional, default none).

    stack = {"proxy": {"http": "http://proxy.lab:3128",
                       "https": "http://user:pass@proxy.lab:3128",   # percent-encode : @ / in pass
                       "no_proxy": ["localhost", "127.0.0.1", ".lab.internal"]}}

``http``/``https`` are the proxy for http:// and https:// URLs (a proxy URL is http:// or
https://, with a host and a port, nothing after the port). ``no_proxy``: host names, ``.domain``
suffixes or IP addresses reached directly (focal's curl 7.68 and apt know no CIDR ranges).

Credentials (``user:pass@``) are a secret: :func:`redact` replaces the password with ``***``
in every text the project shows (``repr`` of the model, spec errors, operation names);
:mod:`p40fleet.proxy` keeps them out of the hosts' command lines.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, model_validator

from p40fleet.spec.fields import _FROZEN, Problem, _Problems

__all__ = ["Proxy", "redact"]

# A URL scheme, tried only where a run of scheme characters starts (any longer run is hidden
# with it: never a password left): unanchored, ``[A-Za-z][A-Za-z0-9+.-]*://`` retried every
# position of a long word (quadratic: a 100 kB URL in a spec error took 2 minutes to redact).
_SCHEME = r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://"
# Userinfo of any URL in a text: scheme://user:password@ (the password is what is hidden).
_USERINFO = re.compile(rf"(?P<head>{_SCHEME}[^\s:/@]*):(?P<pw>[^\s@/]*)@")
# A user part alone (scheme://TOKEN@host: a token as the user name) is hidden whole.
_TOKEN_USER = re.compile(rf"(?P<head>{_SCHEME})[^\s:/@]+@")
# Characters no proxy URL needs (the value is single-quoted in a shell file): percent-encode.
_UNSAFE = re.compile(r"[\s'\"\\`$;<>|&(){}\x00-\x1f\x7f]")
_NO_PROXY_ENTRY = re.compile(r"\.?[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9-]{1,63})*")


def redact(value: Any) -> Any:
    """``value`` with the password of every ``scheme://user:password@`` in it as ``***``, and
    a user part without a password (``scheme://TOKEN@``, a token) as ``***`` whole (strings,
    and the strings inside lists, tuples and dicts); anything else unchanged."""
    if isinstance(value, str):
        return _TOKEN_USER.sub(r"\g<head>***@", _USERINFO.sub(r"\g<head>:***@", value))
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    return value


def _proxy_url(value: str) -> str:
    value = value.strip()
    if _UNSAFE.search(value):
        raise ValueError(
            "expected a proxy URL without spaces, quotes, $, \\, backticks, ;, &, |, <, >, "
            "brackets or control characters (percent-encode them in the password)"
        )
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            "expected a proxy URL http://HOST:PORT or https://HOST:PORT (credentials, if any, "
            "as USER:PASSWORD and '@' before HOST), nothing after the port"
        )
    if parts.username is not None and not parts.username:
        raise ValueError("expected a user name before ':' and '@' (or no credentials)")
    return value.rstrip("/")


def _no_proxy_entry(value: str) -> str:
    value = value.strip()
    if not _NO_PROXY_ENTRY.fullmatch(value) or len(value) > 253:
        raise ValueError(
            "expected a host name, a .domain suffix or an IP address (no CIDR range, no port, "
            "no wildcard: focal's curl and apt do not understand them)"
        )
    return value


ProxyUrl = Annotated[str, AfterValidator(_proxy_url)]
NoProxyEntry = Annotated[str, AfterValidator(_no_proxy_entry)]


class Proxy(BaseModel):
    """The proxy for http:// and https:// fetches, and the hosts reached without it."""

    model_config = _FROZEN

    http: ProxyUrl | None = None
    https: ProxyUrl | None = None
    no_proxy: tuple[NoProxyEntry, ...] = ()

    @model_validator(mode="after")
    def _one_proxy(self) -> Proxy:
        if self.http is None and self.https is None:
            raise _Problems(
                [
                    Problem(
                        ("http",),
                        None,
                        "expected a proxy URL in http and/or https (or no stack.proxy at all)",
                    )
                ]  # fmt: skip
            )
        return self

    @property
    def has_secret(self) -> bool:
        """A password is in one of the URLs: it must stay off command lines and out of logs."""
        return any(url and urlsplit(url).password is not None for url in (self.http, self.https))

    def variables(self) -> dict[str, str]:
        """The environment the fetching tools read (lower and upper case: curl, apt, pip,
        conda and git read one or the other)."""
        out: dict[str, str] = {}
        for name, value in (
            ("http_proxy", self.http),
            ("https_proxy", self.https),
            ("no_proxy", ",".join(self.no_proxy) if self.no_proxy else None),
        ):
            if value:
                out[name] = value
                out[name.upper()] = value
        return out

    def __repr_args__(self):
        for name, value in super().__repr_args__():
            yield name, redact(value)

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in redact(self.variables()).items() if k.islower())
