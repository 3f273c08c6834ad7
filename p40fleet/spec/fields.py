"""Field types of the stack spec: validators, ``Annotated`` types and safe alphabets.

Each validator raises ``ValueError`` whose text is what an admin should supply (``errors.py``
turns it into a ``host X: stack.FIELD = VALUE: EXPECTED`` line). The rules across fields
(``rules.py``) raise :class:`_Problems`, which carries each problem with its own field path.
Nothing here knows a pin: the pinned models and their defaults are in ``pins.py``.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field

# Directories whose content does not survive a reboot or gets cleaned: no persistent target there.
_TMP_DIRS: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm", "/run")
# Directories the OS owns: a deploy that chowns, installs over or links here breaks the host.
_SYSTEM_DIRS: frozenset[str] = frozenset(
    ("/", "/bin", "/boot", "/data", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64",
     "/libx32", "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv",
     "/sys", "/tmp", "/usr", "/usr/bin", "/usr/include", "/usr/lib", "/usr/lib64", "/usr/libexec",
     "/usr/local", "/usr/local/bin", "/usr/local/include", "/usr/local/lib", "/usr/local/sbin",
     "/usr/local/share", "/usr/sbin", "/usr/share", "/usr/src", "/var", "/var/cache", "/var/lib",
     "/var/log", "/var/spool", "/var/tmp")
)  # fmt: skip
# Trees no p40fleet directory may live in: kernel/virtual filesystems, the OS's own files, root's.
_SYSTEM_TREES: tuple[str, ...] = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/root", "/sbin", "/sys",
    "/usr/bin", "/usr/lib", "/usr/sbin", "/usr/share",
)  # fmt: skip
#: Roots a training user's home may sit under (/home/<name>, /srv/<name>, /data/<...>).
HOME_ROOTS: tuple[str, ...] = ("/home", "/srv", "/data")
#: Where a CUDA toolkit dir (and its symlink) may live.
CUDA_ROOTS: tuple[str, ...] = ("/usr/local", "/opt")

_FROZEN = ConfigDict(extra="forbid", frozen=True)


def _is_under(path: str, directory: str, strict: bool = False) -> bool:
    directory = directory.rstrip("/") or "/"
    if path == directory:
        return not strict
    return path.startswith(directory if directory == "/" else directory + "/")


@dataclass(frozen=True)
class Problem:
    """One validation problem: ``loc`` is relative to the model that found it."""

    loc: tuple[str | int, ...]
    value: Any
    expected: str


class _Problems(ValueError):
    """Raised by cross-field validators: carries problems with their own field paths."""

    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.expected}" for p in problems))
        self.problems = problems


# --------------------------------------------------------------------------------------------
# Field types: each validator raises ValueError whose text is what an admin should supply.
# --------------------------------------------------------------------------------------------


def _sha256(value: str) -> str:
    value = value.strip()
    if len(value) != 64 or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        what = f"{len(value)} characters" if len(value) != 64 else "non-hex characters"
        raise ValueError(
            f"expected 64 hex characters (the sha256sum of the file), got {what}",
        )
    return value.lower()


# Values that reach a shell (quoted, but a second line of defence): letters, digits, . _ / + -.
_SAFE_PATH = re.compile(r"[A-Za-z0-9._/+-]+")
_SAFE_NAME = re.compile(r"[A-Za-z0-9._+-]+")
# Shell metacharacters no URL of the spec needs (whitespace is refused separately).
_URL_UNSAFE = re.compile(r"""['"`$\\;<>|]""")


#: Linux's NAME_MAX (bytes of one path component) and PATH_MAX - 1 (bytes of a whole path).
NAME_MAX = 255
PATH_MAX = 4095
#: The longest URL the spec takes (a mirror's URL is short; browsers and proxies cap near here).
URL_MAX = 2048


def _length_problem(value: str) -> str | None:
    """Why ``value`` is too long for a Linux path (None: it fits): found here, not on the host."""
    if len(value.encode()) > PATH_MAX:
        return f"expected a path of at most {PATH_MAX} bytes (Linux's PATH_MAX), got {len(value)}"
    longest = max(value.split("/"), key=len)
    if len(longest.encode()) > NAME_MAX:
        return (
            f"expected path components of at most {NAME_MAX} bytes (Linux's NAME_MAX), got one "
            f"of {len(longest)}"
        )
    return None


def _abs_path(value: str) -> str:
    if too_long := _length_problem(value):
        raise ValueError(too_long)
    if not value.startswith("/"):
        raise ValueError("expected an absolute path (starting with '/')")
    if not _SAFE_PATH.fullmatch(value):
        raise ValueError(
            "expected a path of letters, digits and . _ / + - only (no spaces, quotes, $, ;, "
            "backticks or other shell characters)"
        )
    parts = value.split("/")
    if ".." in parts:
        raise ValueError("expected a path without '..' components (write the real path)")
    normalised = posixpath.normpath(value)
    if normalised.startswith("//"):  # posix keeps a leading '//' as is
        normalised = "/" + normalised.lstrip("/")
    return normalised


#: Where a credential of a mirror belongs instead of the URL (docs/air-gapped.md,
#: "Mirror credentials").
CREDENTIALS_FIX = (
    "put them where each tool reads them (docs/air-gapped.md, 'Mirror credentials'): "
    "the training user's ~/.netrc for pip and git, conda auth login (the conda-auth plugin) "
    "for conda, "
    "/etc/apt/auth.conf.d/ for apt, root's ~/.netrc (with netrc-optional in root's ~/.curlrc) "
    "for the artifact downloads"
)


def url_host_problem(host: str | None) -> str | None:
    """Why ``host`` (a URL's host) is refused (None: it is not): a non-ASCII or punycode name
    can look like another one (``nvidi\u0430.com``, ``xn--nvidi-7ve.com``)."""
    if host and (not host.isascii() or any(lab.startswith("xn--") for lab in host.split("."))):
        return (
            "expected an ASCII host name (a non-ASCII or punycode 'xn--' host can pass for "
            "another one): write the server's plain name or IP address"
        )
    return None


def _http_url(value: str) -> str:
    value = value.strip()
    if len(value) > URL_MAX:
        raise ValueError(f"expected a URL of at most {URL_MAX} characters, got {len(value)}")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or re.search(r"\s", value):
        raise ValueError("expected an http:// or https:// URL")
    if _URL_UNSAFE.search(value) or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(
            "expected a URL without quotes, $, \\, backticks, ;, <, >, | or control characters "
            "(percent-encode them)"
        )
    # Security N9: a credential in a URL would be shown in logs, refusals, reports and
    # operation names, and be readable in the hosts' command lines.
    if "@" in parts.netloc:
        raise ValueError(f"expected a URL without credentials (user:password@); {CREDENTIALS_FIX}")
    if host_problem := url_host_problem(parts.hostname):
        raise ValueError(host_problem)
    if not value.isascii():
        raise ValueError("expected an ASCII URL (percent-encode other characters)")
    return value


def _base_url(value: str) -> str:
    return _http_url(value).rstrip("/")


def _url_or_abs_path(value: str) -> str:
    if value.startswith("/"):
        return _abs_path(value)
    if value.strip().lower().startswith(("http://", "https://")):
        return _base_url(value)  # with its own reason (credentials, host, length)
    raise ValueError("expected an http(s) URL or an absolute directory path")


def _filename(value: str) -> str:
    if len(value.encode()) > NAME_MAX:
        raise ValueError(
            f"expected a file name of at most {NAME_MAX} bytes (Linux's NAME_MAX), got {len(value)}"
        )
    if not value or "/" in value or value in (".", "..") or "\x00" in value:
        raise ValueError("expected a plain file name (no '/'), e.g. the last part of the URL")
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(
            "expected a file name of letters, digits and . _ + - only (no spaces, quotes, $, ;, "
            "backticks or other shell characters)"
        )
    return value


#: What ``tar -xf`` reads on focal (GNU tar 1.30, no zstd binary): plain tar, gzip, bzip2, xz.
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")


def _tar_archive_name(value: str) -> str:
    if value.lower().endswith(TAR_SUFFIXES):
        return value
    zstd = value.lower().endswith((".zst", ".zstd", ".tzst"))
    raise ValueError(
        ("a zstd archive needs tar >= 1.31 and a zstd binary; Ubuntu 20.04 has tar 1.30 and no "
         "zstd. " if zstd else "")
        + "expected a tar archive tar 1.30 can unpack, named for it: "
        + ", ".join(TAR_SUFFIXES)
        + " (repack it, e.g. tar -cJf NAME.tar.xz DIR/, and update sha256)"
    )  # fmt: skip


def _pattern(regex: str, expected: str):
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(expected)
        return value

    return check


def _pep440(value: str) -> str:
    try:
        parsed = Version(value)
    except InvalidVersion:
        raise ValueError("expected a PEP 440 version such as 2.6.0+cu118") from None
    if str(parsed) != value:
        raise ValueError(f"expected a PEP 440 version in normal form, i.e. {str(parsed)!r}")
    return value


def _python_version_text(value: Any) -> Any:
    """A number is refused before pydantic sees it: YAML/Python's 3.10 is the float 3.1."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(
            "expected the version as a string in quotes, such as '3.10.12' (written as a number "
            "it loses digits: 3.10 is 3.1)"
        )
    return value


def _python_version(value: str) -> str:
    if not re.fullmatch(r"3\.\d{1,2}\.\d{1,2}", value):
        raise ValueError("expected a Python version X.Y.Z such as 3.10.12")
    minor = int(value.split(".")[1])
    if minor < 10:
        raise ValueError("expected Python 3.10 or newer (verl needs Python >= 3.10)")
    return value


Sha256 = Annotated[str, AfterValidator(_sha256)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
BaseUrl = Annotated[str, AfterValidator(_base_url)]
FileName = Annotated[str, AfterValidator(_filename)]
TarArchiveName = Annotated[str, AfterValidator(_filename), AfterValidator(_tar_archive_name)]
GitCommit = Annotated[
    str,
    BeforeValidator(lambda v: v.strip().lower() if isinstance(v, str) else v),
    AfterValidator(
        _pattern(r"[0-9a-f]{40}", "expected a full 40-hex-character git commit id (git rev-parse)")
    ),
]
GitRef = Annotated[
    str,
    AfterValidator(
        _pattern(
            r"(?![-/])(?!.*\.\.)(?!.*//)[A-Za-z0-9._/-]+(?<![/.])",
            "expected a git tag or branch name such as v0.5.0 (not starting with '-' or '/')",
        )
    ),
]
Pep440 = Annotated[str, AfterValidator(_pep440)]


def _cuda_dir_problem(path: str, what: str, example: str) -> str | None:
    """Why ``path`` cannot be a CUDA dir or its link (None: it can): under /usr/local or /opt,
    named ``*cuda*``, never a system directory (the runfile installs over it, cuDNN's stale
    files are removed from it, the link step replaces what is there)."""
    if path in _SYSTEM_DIRS or not any(_is_under(path, root, strict=True) for root in CUDA_ROOTS):
        return (
            f"expected {what} under {' or '.join(CUDA_ROOTS)} with 'cuda' in its name, such as "
            f"{example} (not a system directory)"
        )
    if "cuda" not in posixpath.basename(path).lower():
        return f"expected {what} with 'cuda' in its name, such as {example}"
    return None


def _root_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot hold root's downloads or cuDNN tree (None: it can): not a system
    directory itself, not inside the OS's trees, not a tmp dir anyone may write to, not a home."""
    if path in _SYSTEM_DIRS and not any(_is_under(path, tmp) for tmp in _TMP_DIRS):
        return (
            "expected a dedicated directory such as /var/cache/p40fleet, not a system directory "
            "(p40fleet creates, chowns and deletes files in it as root)"
        )
    for tree in (*_TMP_DIRS, *_SYSTEM_TREES, "/home"):
        if _is_under(path, tree):
            why = "a tmp dir any local user can write to" if tree in _TMP_DIRS else "a system tree"
            if tree == "/home":
                why = "users' homes (a user could swap what root runs)"
            return (
                f"expected a root-only directory such as /var/cache/p40fleet, not under {tree} "
                f"({why})"
            )
    return None


_APT_WORD = r"[A-Za-z0-9][A-Za-z0-9._+~-]*"


def _host_address(value: str) -> str:
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):  # [2001:db8::1], as in a URL
        try:
            return str(ipaddress.IPv6Address(value[1:-1]))
        except ValueError:
            raise ValueError("expected an IPv6 address inside [ ], such as [2001:db8::1]") from None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not re.fullmatch(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?"
                        r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*", value):  # fmt: skip
        raise ValueError("expected an IP address or a DNS host name such as node1.lab")
    return value


def _ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValueError("expected an IP address of this host, such as 10.0.0.11") from None


Port = Annotated[int, Field(ge=1024, le=65535)]
