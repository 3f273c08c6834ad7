"""The validated stack spec: what a P40 host gets, pinned and checked before anything runs.

Where the values come from
--------------------------
pyinfra host data key ``stack`` (a dict, usually set in ``inventories/group_data/all.py``) is
deep-merged with host data key ``stack_host`` (per-host overrides, set in the inventory) and
validated into a frozen :class:`StackSpec`. Every default below is the real pin of the real-lab
stack (see ``docs/stack-facts.md`` §1), so an empty ``stack`` dict is a complete, correct spec.

Errors
------
:func:`load_spec` turns pydantic's ``ValidationError`` into :class:`SpecError`, one line per
problem, worded for an admin::

    host lab1: stack.cuda.sha256 = 'abc': expected 64 hex characters (sha256sum of the file)

Public API
----------
``StackSpec`` (and its parts), ``SpecError``, ``load_spec``, ``spec_for_host``,
``clear_spec_cache``, ``deep_merge``, ``ARTIFACTS``, ``GIT_PINS``, ``COMPONENTS``.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticUndefined

__all__ = [
    "ARTIFACTS",
    "ApexPin",
    "COMPONENTS",
    "GIT_PINS",
    "Artifact",
    "CudaArtifact",
    "CudnnArtifact",
    "DriverArtifact",
    "GitPin",
    "MinicondaArtifact",
    "Mirror",
    "Paths",
    "Policy",
    "Problem",
    "PythonEnv",
    "RayCluster",
    "SpecError",
    "StackSpec",
    "TorchPin",
    "Training",
    "TrainingArchive",
    "TrainingData",
    "TrainingModel",
    "TrainingUser",
    "VerlPin",
    "clear_spec_cache",
    "deep_merge",
    "host_key_problem",
    "load_spec",
    "spec_for_host",
]

#: Names accepted by :meth:`StackSpec.artifact_url` (fields of StackSpec that are artifacts).
ARTIFACTS: tuple[str, ...] = ("driver", "cuda", "cudnn", "miniconda")
#: Names accepted by :meth:`StackSpec.git_remote` (repo name on a mirror = NAME.git).
GIT_PINS: tuple[str, ...] = ("apex", "verl")
#: Component names accepted in ``policy.force_reinstall``.
COMPONENTS: tuple[str, ...] = (
    "driver",
    "cuda",
    "cudnn",
    "miniconda",
    "env",
    "torch",
    "apex",
    "verl",
)

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

#: PyPI, the rest of the torch closure when no mirror is set (the torch index lacks new pins).
PYPI_SIMPLE = "https://pypi.org/simple"

# Default locations of the env paths, relative to user.home.
_ENV_SUBDIRS = {
    "conda_prefix": "miniconda3",
    "verl_checkout": "verl",
    "data_dir": "data",
    "model_dir": "models",
}


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


def _abs_path(value: str) -> str:
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


def _http_url(value: str) -> str:
    value = value.strip()
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or re.search(r"\s", value):
        raise ValueError("expected an http:// or https:// URL")
    if _URL_UNSAFE.search(value) or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(
            "expected a URL without quotes, $, \\, backticks, ;, <, >, | or control characters "
            "(percent-encode them)"
        )
    return value


def _base_url(value: str) -> str:
    return _http_url(value).rstrip("/")


def _url_or_abs_path(value: str) -> str:
    if value.startswith("/"):
        return _abs_path(value)
    try:
        return _base_url(value)
    except ValueError:
        raise ValueError("expected an http(s) URL or an absolute directory path") from None


def _filename(value: str) -> str:
    if not value or "/" in value or value in (".", "..") or "\x00" in value:
        raise ValueError("expected a plain file name (no '/'), e.g. the last part of the URL")
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(
            "expected a file name of letters, digits and . _ + - only (no spaces, quotes, $, ;, "
            "backticks or other shell characters)"
        )
    return value


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


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class Artifact(BaseModel):
    """A downloaded file: used only after its sha256 matches."""

    model_config = _FROZEN

    version: str = Field(min_length=1)
    filename: FileName
    url: HttpUrl
    sha256: Sha256
    size: int | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _forget_default_size(cls, data: Any) -> Any:
        # The default size belongs to the default version: a new version without a size has none.
        if isinstance(data, Mapping) and "size" not in data and "version" in data:
            field = cls.model_fields["version"]
            if field.default is not PydanticUndefined and data["version"] != field.default:
                data = {**data, "size": None}
        return data


class DriverArtifact(Artifact):
    version: Annotated[
        str,
        AfterValidator(
            _pattern(
                r"\d{3}\.\d{2,3}(\.\d{2})?",
                "expected an NVIDIA driver version NNN.NN.NN or NNN.NN such as 525.147.05",
            )
        ),
    ] = "525.147.05"
    # The R525 branch ends at 525.147.05 (the branch is EOL); NVIDIA publishes the sha256 only.
    filename: FileName = "NVIDIA-Linux-x86_64-525.147.05.run"
    url: HttpUrl = (
        "https://us.download.nvidia.com/tesla/525.147.05/NVIDIA-Linux-x86_64-525.147.05.run"
    )
    sha256: Sha256 = "435183ea545c7e12e3044d7986da07758a3369befe7ee519eb3b063d4af3fef1"
    size: int | None = Field(default=None, gt=0)


class CudaArtifact(Artifact):
    version: Annotated[
        str,
        AfterValidator(
            _pattern(r"\d{1,2}\.\d{1,2}\.\d{1,3}", "expected a CUDA version X.Y.Z such as 11.8.0")
        ),
    ] = "11.8.0"
    filename: FileName = "cuda_11.8.0_520.61.05_linux.run"
    url: HttpUrl = (
        "https://developer.download.nvidia.com/compute/cuda/11.8.0/local_installers/"
        "cuda_11.8.0_520.61.05_linux.run"
    )
    sha256: Sha256 = "9223c4af3aebe4a7bbed9abd9b163b03a1b34b855fbc2b4a0d1b706ac09a5a16"
    size: int | None = Field(default=4336730777, gt=0)
    # Room the runfile unpacks itself into (--tmpdir) before installing; None: 1.1 x size.
    unpack_bytes: int | None = Field(default=None, gt=0)

    def tmp_bytes(self) -> int:
        """Bytes --tmpdir must have free for the install (the unpack, or 1.1 x the file)."""
        if self.unpack_bytes:
            return self.unpack_bytes
        return int(self.size * 1.1) if self.size else 4_500_000_000


class CudnnArtifact(Artifact):
    version: Annotated[
        str,
        AfterValidator(
            _pattern(
                r"\d{1,2}\.\d{1,2}\.\d{1,3}(\.\d{1,4})?",
                "expected a cuDNN version such as 8.9.7.29",
            )
        ),
    ] = "8.9.7.29"
    filename: FileName = "cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"
    url: HttpUrl = (
        "https://developer.download.nvidia.com/compute/cudnn/redist/cudnn/linux-x86_64/"
        "cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"
    )
    sha256: Sha256 = "a3e2509028cecda0117ce5a0f42106346e82e86d390f4bb9475afc976c77402e"
    size: int | None = Field(default=860967256, gt=0)


class MinicondaArtifact(Artifact):
    version: Annotated[
        str,
        AfterValidator(
            _pattern(
                r"py3\d{1,2}_\d+\.\d+\.\d+-\d+",
                "expected a Miniconda version pyXY_A.B.C-N such as py310_24.11.1-0",
            )
        ),
    ] = "py310_24.11.1-0"
    filename: FileName = "Miniconda3-py310_24.11.1-0-Linux-x86_64.sh"
    url: HttpUrl = "https://repo.anaconda.com/miniconda/Miniconda3-py310_24.11.1-0-Linux-x86_64.sh"
    sha256: Sha256 = "7a3cdbb78a642b2b6dd0687c9e09824e53330368ab57406e27d88e25c4fe4e40"
    size: int | None = Field(default=None, gt=0)


class TorchSums(BaseModel):
    """sha256 of torch index wheels, for lock lines that carry none (see ``TorchPin.sha256``)."""

    model_config = _FROZEN

    torch: Sha256 | None = None
    torchvision: Sha256 | None = None
    torchaudio: Sha256 | None = None

    def given(self) -> dict[str, str]:
        """``{distribution: sha256}`` of the sums set."""
        return {name: value for name, value in self.model_dump().items() if value}


class TorchPin(BaseModel):
    """The torch trio, installed together from one index (they must match each other)."""

    model_config = _FROZEN

    version: Pep440 = "2.6.0+cu118"
    # None: not installed (e.g. a lab wheelhouse that carries torch alone).
    torchvision: Pep440 | None = "0.21.0+cu118"
    torchaudio: Pep440 | None = "2.6.0+cu118"
    index_url: BaseUrl = "https://download.pytorch.org/whl/cu118"
    # {distribution: sha256} for torch/torchvision/torchaudio wheels whose sum the lock file
    # (files/torch-requirements-<variant>.txt) does not carry; the torch step refuses without.
    sha256: TorchSums = Field(default_factory=lambda: TorchSums())


class GitPin(BaseModel):
    """A git checkout pinned by commit; ``ref`` is the human name checked against ``commit``."""

    model_config = _FROZEN

    remote: HttpUrl
    ref: GitRef
    commit: GitCommit


class ApexPin(GitPin):
    remote: HttpUrl = "https://github.com/NVIDIA/apex"
    ref: GitRef = "25.09"
    commit: GitCommit = "4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49"
    # --cuda_ext as well as --cpp_ext; None: when the torch pin is a CUDA build (+cuXYZ).
    cuda_ext: bool | None = None


class VerlPin(GitPin):
    # v0.5.0 still has the HF rollout (removed upstream on 2025-08-18): the only P40 rollout.
    remote: HttpUrl = "https://github.com/volcengine/verl"
    ref: GitRef = "v0.5.0"
    commit: GitCommit = "8fdc4d3f202f41461f4de9f42a637228e342668b"
    version: Pep440 = "0.5.0"
    # Which files/verl-requirements-<variant>.txt pins verl's import-time dependencies;
    # None: "v0.5.0" for a CUDA torch pin, "lab" for the simulated lab's CPU torch.
    requirements: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]+$")


class Paths(BaseModel):
    model_config = _FROZEN

    cuda_dir: AbsPath = "/usr/local/cuda-11.8"
    cuda_link: AbsPath = "/usr/local/cuda"
    # cuDNN files are hard-linked into cuda_dir: same filesystem, and not a tmp dir.
    cudnn_extract_dir: AbsPath = "/usr/local/src"
    artifact_cache: AbsPath = "/var/cache/p40fleet"

    @model_validator(mode="after")
    def _checks(self) -> Paths:
        problems = [
            Problem(("cuda_dir",), self.cuda_dir, expected)
            for expected in [
                _cuda_dir_problem(self.cuda_dir, "a toolkit dir", "/usr/local/cuda-11.8")
            ]
            if expected
        ]
        problems += [
            Problem(("cuda_link",), self.cuda_link, expected)
            for expected in [_cuda_dir_problem(self.cuda_link, "a symlink", "/usr/local/cuda")]
            if expected
        ]
        for tmp in _TMP_DIRS:
            if _is_under(self.cudnn_extract_dir, tmp):
                problems.append(
                    Problem(
                        ("cudnn_extract_dir",),
                        self.cudnn_extract_dir,
                        f"expected a persistent directory, not under {tmp} (cuDNN files are "
                        "hard-linked from here into the CUDA dir), e.g. /usr/local/src",
                    )
                )
        for field in ("artifact_cache", "cudnn_extract_dir"):
            value = getattr(self, field)
            if any(p.loc == (field,) for p in problems):
                continue  # one reason per field is enough
            if expected := _root_dir_problem(value):
                problems.append(Problem((field,), value, expected))
        if self.cuda_link == self.cuda_dir:
            problems.append(
                Problem(
                    ("cuda_link",),
                    self.cuda_link,
                    "expected a symlink path different from cuda_dir (e.g. /usr/local/cuda)",
                )
            )
        if problems:
            raise _Problems(problems)
        return self


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


class TrainingUser(BaseModel):
    model_config = _FROZEN

    name: Annotated[
        str,
        AfterValidator(
            _pattern(
                r"[a-z_][a-z0-9_-]{0,31}",
                "expected a Unix user name: lowercase letters, digits, '_' or '-', at most 32",
            )
        ),
    ] = "verl"
    uid: int = Field(default=2001, ge=1000, le=60000)
    home: AbsPath = "/home/verl"

    @model_validator(mode="after")
    def _checks(self) -> TrainingUser:
        # The user gets to own its home: a system dir there (/etc, /usr, /home itself) is root.
        if self.home in _SYSTEM_DIRS or not any(
            _is_under(self.home, root, strict=True) for root in HOME_ROOTS
        ):
            raise _Problems(
                [
                    Problem(
                        ("home",),
                        self.home,
                        f"expected a home directory of its own such as /home/{self.name} "
                        f"(under {', '.join(HOME_ROOTS)}; never a system directory, which the "
                        "user would then own)",
                    )
                ]
            )
        return self


class PythonEnv(BaseModel):
    """The conda env and the user's working dirs: all under user.home (survives a reinstall)."""

    model_config = _FROZEN

    conda_prefix: AbsPath = "/home/verl/miniconda3"
    name: Annotated[
        str,
        AfterValidator(
            _pattern(
                r"[A-Za-z0-9][A-Za-z0-9_.-]*",
                "expected a conda env name: letters, digits, '_', '.' or '-'",
            )
        ),
    ] = "verl-p40"
    verl_checkout: AbsPath = "/home/verl/verl"
    data_dir: AbsPath = "/home/verl/data"
    model_dir: AbsPath = "/home/verl/models"


_APT_WORD = r"[A-Za-z0-9][A-Za-z0-9._+~-]*"


class AptMirror(BaseModel):
    """The mirror's apt repository: one ``deb`` line in sources.list.d/p40fleet-mirror.list.

    ``suite`` ending in ``/`` is a flat repository (``deb URL ./``, no components), as apt
    defines it. apt checks signatures unless told not to: ``signed_by`` is the repository's key
    file on the controller (binary ``.gpg`` or armored ``.asc``), which the deploy ships to
    ``/etc/apt/keyrings/``; ``trusted: True`` (apt's ``[trusted=yes]``) turns the check off and
    is never implied.
    """

    model_config = _FROZEN

    url: BaseUrl
    suite: Annotated[
        str,
        AfterValidator(
            _pattern(
                rf"{_APT_WORD}(/{_APT_WORD})*/?|\./?",
                "expected an apt suite such as focal (or ./ for a flat repository)",
            )
        ),
    ]
    components: tuple[
        Annotated[str, AfterValidator(_pattern(_APT_WORD, "expected a component such as main"))],
        ...,
    ] = ()
    # More suites of the same repository, e.g. focal-updates and focal-security (where Ubuntu
    # puts the headers of the kernels it updates): one more line each.
    extra_suites: tuple[
        Annotated[
            str, AfterValidator(_pattern(_APT_WORD, "expected a suite such as focal-updates"))
        ],
        ...,
    ] = ()
    signed_by: AbsPath | None = None
    trusted: bool = False

    @model_validator(mode="after")
    def _checks(self) -> AptMirror:
        found: list[tuple[str, Any, str]] = []
        flat = self.suite.endswith("/")
        if flat and self.extra_suites:
            found.append(("extra_suites", list(self.extra_suites), "expected none with a "
                          "flat suite ending in '/' (a flat repository has one)"))  # fmt: skip
        if flat and self.components:
            found.append(("components", list(self.components), "expected no components with "
                          "a flat suite ending in '/'"))  # fmt: skip
        if not flat and not self.components:
            found.append(("components", [], "expected at least one component such as main "
                          "(or a flat suite such as ./)"))  # fmt: skip
        if self.signed_by is not None and self.trusted:
            found.append(("trusted", True, "expected trusted: False with signed_by (a signed "
                          "repository is checked, not trusted)"))  # fmt: skip
        elif self.signed_by is None and not self.trusted:
            found.append(("signed_by", None, "expected the repository's key file on the "
                          "controller (.gpg or .asc), or trusted: True to turn apt's "
                          "signature check off for this mirror"))  # fmt: skip
        elif self.signed_by is not None and not self.signed_by.endswith((".gpg", ".asc")):
            found.append(("signed_by", self.signed_by, "expected a key file named *.gpg "
                          "(binary) or *.asc (armored), as apt needs"))  # fmt: skip
        elif self.signed_by is not None and not posixpath.isfile(self.signed_by):
            found.append(("signed_by", self.signed_by, "expected an existing key file on the "
                          "controller (gpg --export KEYID > FILE.gpg)"))  # fmt: skip
        if found:
            raise _Problems([Problem((field,), value, text) for field, value, text in found])
        return self


class Mirror(BaseModel):
    """A local mirror; any part left None falls back to upstream.

    ``air_gapped``: the hosts reach nothing but the mirror, so every source must be mirrored and
    the deploy moves the distribution's own apt sources aside (to /etc/apt/p40fleet-aside/).
    """

    model_config = _FROZEN

    artifacts_url: BaseUrl | None = None
    pip_index_url: BaseUrl | None = None
    pip_find_links: Annotated[str, AfterValidator(_url_or_abs_path)] | None = None
    git_base_url: BaseUrl | None = None
    apt: AptMirror | None = None
    conda_channel: BaseUrl | None = None
    air_gapped: bool = False

    @model_validator(mode="after")
    def _air_gapped_needs_all(self) -> Mirror:
        if not self.air_gapped:
            return self
        missing = [
            name
            for name, value in (
                ("artifacts_url", self.artifacts_url),
                ("pip_index_url", self.pip_index_url or self.pip_find_links),
                ("git_base_url", self.git_base_url),
                ("apt", self.apt),
                ("conda_channel", self.conda_channel),
            )
            if value is None
        ]
        if missing:
            what = {"apt": "an apt source (url, suite, ...)"}
            raise _Problems([Problem((name,), None, f"expected {what.get(name, 'a mirror URL')}: "
                                     "an air-gapped host has no other source (or set "
                                     "air_gapped: False)") for name in missing])  # fmt: skip
        return self


class Policy(BaseModel):
    """Knobs that allow the deploy to do disruptive things; all off by default."""

    model_config = _FROZEN

    allow_reboot: bool = False
    # conda-forge: no ToS, and Anaconda's terms limit free use of its default channels by
    # organisations of more than 200 people; "accept" uses those (ToS accepted where needed)
    conda_tos: Literal["accept", "conda-forge"] = "conda-forge"
    force_reinstall: tuple[Literal[COMPONENTS], ...] = ()  # type: ignore[valid-type]
    allow_gcc_override: bool = False
    allow_maxwell: bool = False
    # SSH with a host key not checked against known_hosts ("accept-new", "no"): an explicit opt-in.
    allow_unverified_host_keys: bool = False


def _host_address(value: str) -> str:
    value = value.strip()
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


class RayCluster(BaseModel):
    """The Ray cluster of deploy/ray.py: one head, every other host joins it."""

    model_config = _FROZEN

    # Inventory name of the head host; None: the one host of the inventory group ``ray_head``.
    head: Annotated[str, AfterValidator(_host_address)] | None = None
    # What the members dial to reach the head; None: the head's ssh_hostname (else its name).
    head_address: Annotated[str, AfterValidator(_host_address)] | None = None
    port: Port = 6379  # the head's GCS port
    # This host's address for Ray (set per host in stack_host); None: Ray picks it.
    node_ip: Annotated[str, AfterValidator(_ip)] | None = None
    dashboard: bool = False
    # Ray has no authentication: the dashboard (and its Jobs API, which runs code) listens on
    # the head's loopback (reach it with ssh -L); another address opens it to that network.
    dashboard_host: Annotated[str, AfterValidator(_ip)] = "127.0.0.1"
    dashboard_port: Port = 8265
    # Nodes verify expects in the cluster; None: every host of the inventory.
    nodes: int | None = Field(default=None, ge=1)
    # Ray's --temp-dir (session dirs, logs); Ray's own default.
    temp_dir: AbsPath = "/tmp/ray"

    @model_validator(mode="after")
    def _checks(self) -> RayCluster:
        if self.dashboard and self.dashboard_port == self.port:
            raise _Problems(
                [Problem(("dashboard_port",), self.dashboard_port,
                         f"expected a port other than ray.port {self.port}")]
            )  # fmt: skip
        return self


class TrainingArchive(BaseModel):
    """A tar archive of a model or data directory: fetched, sha256-checked, then unpacked.

    From ``mirror.artifacts_url/<filename>`` when the mirror is set, else from ``url``.
    """

    model_config = _FROZEN

    filename: FileName
    url: HttpUrl | None = None
    sha256: Sha256
    size: int | None = Field(default=None, gt=0)


class TrainingModel(BaseModel):
    """The Hugging Face model directory ``env.model_dir/<name>`` the launch script trains."""

    model_config = _FROZEN

    name: FileName = "Qwen2.5-0.5B-Instruct"
    # None: the admin puts the model there; deploy/training.py only checks it.
    archive: TrainingArchive | None = None


class TrainingData(BaseModel):
    """The dataset directory ``env.data_dir/<name>`` with verl's parquet files."""

    model_config = _FROZEN

    name: FileName = "gsm8k"
    train_file: FileName = "train.parquet"
    val_file: FileName = "test.parquet"
    archive: TrainingArchive | None = None


class Training(BaseModel):
    """What ``~/launch-ppo.sh`` trains on, and the sequence lengths the plan is sized for."""

    model_config = _FROZEN

    model: TrainingModel = Field(default_factory=TrainingModel)
    data: TrainingData = Field(default_factory=TrainingData)
    # verl's own defaults (data.max_prompt_length, data.max_response_length).
    max_prompt_length: int = Field(default=512, ge=16, le=32768)
    max_response_length: int = Field(default=512, ge=16, le=32768)


class StackSpec(BaseModel):
    model_config = _FROZEN

    driver: DriverArtifact = Field(default_factory=DriverArtifact)
    cuda: CudaArtifact = Field(default_factory=CudaArtifact)
    cudnn: CudnnArtifact = Field(default_factory=CudnnArtifact)
    miniconda: MinicondaArtifact = Field(default_factory=MinicondaArtifact)
    python_version: Annotated[str, AfterValidator(_python_version)] = "3.10.12"
    torch: TorchPin = Field(default_factory=TorchPin)
    apex: ApexPin = Field(default_factory=ApexPin)
    verl: VerlPin = Field(default_factory=VerlPin)
    paths: Paths = Field(default_factory=Paths)
    user: TrainingUser = Field(default_factory=TrainingUser)
    env: PythonEnv = Field(default_factory=PythonEnv)
    mirror: Mirror | None = None
    policy: Policy = Field(default_factory=Policy)
    ray: RayCluster = Field(default_factory=RayCluster)
    training: Training = Field(default_factory=Training)

    @model_validator(mode="before")
    @classmethod
    def _defaults_follow_user(cls, data: Any) -> Any:
        """user.home defaults to /home/NAME, env paths default to under user.home."""
        if not isinstance(data, Mapping):
            return data
        user = data.get("user", {})
        env = data.get("env", {})
        if not isinstance(user, Mapping) or not isinstance(env, Mapping):
            return data
        name = user.get("name", "verl")
        if "home" not in user and isinstance(name, str) and name:
            user = {**user, "home": f"/home/{name}"}
        home = user.get("home")
        if isinstance(home, str) and home.startswith("/"):
            home = home.rstrip("/") or "/"
            env = {
                **{key: posixpath.join(home, sub) for key, sub in _ENV_SUBDIRS.items()},
                **env,
            }
        return {**data, "user": user, "env": env}

    @model_validator(mode="after")
    def _env_under_home(self) -> StackSpec:
        home = self.user.home
        problems = [
            Problem(
                ("env", field),
                value,
                f"expected a path under user.home {home!r} (so it survives an OS reinstall "
                f"that keeps /home), e.g. {posixpath.join(home, posixpath.basename(value))!r}",
            )
            for field, value in self.env.model_dump().items()
            if field != "name" and not _is_under(value, home, strict=True)
        ]
        problems += self._half_done_overrides()
        problems += self._training_archives_reachable()
        if problems:
            raise _Problems(problems)
        return self

    def _half_done_overrides(self) -> list[Problem]:
        """A changed version with the old version's file/sum/commit left in place."""
        problems = []
        mirrored = self.mirror is not None and self.mirror.artifacts_url is not None
        for name in ARTIFACTS:
            artifact: Artifact = getattr(self, name)
            default = type(artifact).model_fields["version"].default
            if "version" not in artifact.model_fields_set or artifact.version == default:
                continue
            needed = ["filename", "sha256"] + ([] if mirrored else ["url"])
            missing = [key for key in needed if key not in artifact.model_fields_set]
            if missing:
                problems.append(
                    Problem(
                        (name, "version"),
                        artifact.version,
                        f"also set {', '.join(f'{name}.{key}' for key in missing)} for this "
                        f"version (the defaults belong to {default})",
                    )
                )
        for name in GIT_PINS:
            pin: GitPin = getattr(self, name)
            changed = {"ref", "commit"} & pin.model_fields_set
            default_pin = type(pin)()
            if not changed or (pin.ref, pin.commit) == (default_pin.ref, default_pin.commit):
                continue
            needed = ["ref", "commit"] + (["version"] if name == "verl" else [])
            missing = [key for key in needed if key not in pin.model_fields_set]
            if missing:
                problems.append(
                    Problem(
                        (name, sorted(changed)[0]),
                        getattr(pin, sorted(changed)[0]),
                        f"also set {', '.join(f'{name}.{key}' for key in missing)} "
                        f"(the defaults belong to {default_pin.ref} = {default_pin.commit[:12]})",
                    )
                )
        return problems

    def _training_archives_reachable(self) -> list[Problem]:
        """A training archive needs a URL unless the mirror's artifacts serve it."""
        if self.mirror is not None and self.mirror.artifacts_url:
            return []
        return [
            Problem(("training", which, "archive", "url"), None,
                    "expected a URL for the archive (or set mirror.artifacts_url)")
            for which in ("model", "data")
            if (archive := getattr(self.training, which).archive) is not None
            and archive.url is None
        ]  # fmt: skip

    # -- derived helpers ---------------------------------------------------------------------

    def training_archive_url(self, which: str) -> str | None:
        """Where ``training.<which>.archive`` comes from (``"model"`` or ``"data"``), or None."""
        archive = getattr(self.training, which).archive
        if archive is None:
            return None
        if self.mirror is not None and self.mirror.artifacts_url:
            return f"{self.mirror.artifacts_url}/{archive.filename}"
        return archive.url

    @property
    def driver_branch(self) -> str:
        """The driver branch, e.g. ``"525"`` for 525.147.05."""
        return self.driver.version.split(".", 1)[0]

    def artifact(self, name: str) -> Artifact:
        if name not in ARTIFACTS:
            raise KeyError(f"unknown artifact {name!r} (known: {', '.join(ARTIFACTS)})")
        return getattr(self, name)

    def artifact_url(self, name: str) -> str:
        """Where to download artifact ``name`` from: the mirror when set, else upstream."""
        artifact = self.artifact(name)
        if self.mirror is not None and self.mirror.artifacts_url:
            return f"{self.mirror.artifacts_url}/{artifact.filename}"
        return artifact.url

    def git_remote(self, name: str) -> str:
        """The git remote for ``"verl"`` or ``"apex"``: mirror.git_base_url/NAME.git when set."""
        if name not in GIT_PINS:
            raise KeyError(f"unknown git pin {name!r} (known: {', '.join(GIT_PINS)})")
        if self.mirror is not None and self.mirror.git_base_url:
            return f"{self.mirror.git_base_url}/{name}.git"
        return getattr(self, name).remote

    def pip_index_args(self) -> list[str]:
        """pip arguments that select where the torch trio (and the pinned deps) come from.

        - mirror with a PEP 503 index: ``--index-url URL`` (+ ``--find-links`` if also set);
        - mirror with only a wheelhouse: ``--no-index --find-links DIR_OR_URL``;
        - no mirror: ``--index-url`` the real torch index (cu118 wheels are only there) and PyPI
          for the rest of the closure; safe because every file is checked by --require-hashes.
        """
        return self._mirror_pip_args() or [
            "--index-url",
            self.torch.index_url,
            "--extra-index-url",
            PYPI_SIMPLE,
        ]

    def pip_deps_args(self) -> list[str]:
        """pip arguments for verl's pinned dependencies: the mirror, else PyPI (no arguments)."""
        return self._mirror_pip_args()

    def _mirror_pip_args(self) -> list[str]:
        mirror = self.mirror
        if mirror is None or not (mirror.pip_index_url or mirror.pip_find_links):
            return []
        if mirror.pip_index_url:
            args = ["--index-url", mirror.pip_index_url]
            if mirror.pip_find_links:
                args += ["--find-links", mirror.pip_find_links]
        else:
            args = ["--no-index", "--find-links", mirror.pip_find_links]
        # A plain-http mirror (an air-gapped lab's) must be named trusted or pip ignores it. Only
        # hash-locked installs use these arguments (--require-hashes): the transport is not
        # trusted, the sums are. An https mirror is never named trusted.
        for url in (mirror.pip_index_url, mirror.pip_find_links):
            if url and url.startswith("http://"):
                args += ["--trusted-host", urlsplit(url).hostname]
        return _dedupe_trusted(args)


def _dedupe_trusted(args: list[str]) -> list[str]:
    """Drop a repeated ``--trusted-host HOST`` pair (index and find-links on one mirror)."""
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        if args[i] == "--trusted-host":
            if args[i + 1] not in seen:
                seen.add(args[i + 1])
                out += args[i : i + 2]
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


def _short_repr(value: Any, limit: int = 90) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SpecError(ValueError):
    """A stack spec that does not validate. ``str()`` is one admin-readable line per problem.

    ``host``, ``field``, ``value``, ``expected`` describe the first problem; ``problems`` holds
    all of them as ``(field, value, expected)`` tuples.
    """

    def __init__(
        self,
        host: str,
        field: str,
        value: Any,
        expected: str,
        *,
        problems: Iterable[tuple[str, Any, str]] | None = None,
    ):
        self.host = host
        self.field = field
        self.value = value
        self.expected = expected
        self.problems: tuple[tuple[str, Any, str], ...] = tuple(
            problems if problems is not None else [(field, value, expected)]
        )
        super().__init__(str(self))

    @classmethod
    def from_problems(cls, host: str, problems: Iterable[tuple[str, Any, str]]) -> SpecError:
        problems = list(problems)
        field, value, expected = problems[0]
        return cls(host, field, value, expected, problems=problems)

    def lines(self) -> list[str]:
        return [
            f"host {self.host}: {field} = {_short_repr(value)}: {expected}"
            for field, value, expected in self.problems
        ]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __reduce__(self):
        return (_rebuild_spec_error, (self.host, self.problems))


def _rebuild_spec_error(host, problems):
    return SpecError.from_problems(host, problems)


def _unwrap_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class reached by following ``loc`` from StackSpec (None if not a model)."""
    model: Any = StackSpec
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _unwrap_optional(field.annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model
    return None


def _get_path(data: Any, loc: tuple) -> tuple[bool, Any]:
    for part in loc:
        if isinstance(data, Mapping) and part in data:
            data = data[part]
        elif isinstance(data, (list, tuple)) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return False, None
    return True, data


_TYPE_WORDS = {
    "string_type": "expected a string (in quotes)",
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "bool_type": "expected True or False",
    "bool_parsing": "expected True or False",
    "list_type": "expected a list",
    "tuple_type": "expected a list",
    "missing": "required setting is missing",
}


def _dotted(loc: tuple) -> str:
    text = "stack"
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _expected_for(error: Mapping[str, Any], loc: tuple) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent else "?"
        return f"unknown key {loc[-1]!r} (allowed: {allowed})"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        model = _model_at(loc)
        if model is not None:
            return f"expected a dict with keys from: {', '.join(model.model_fields)}"
        return "expected a dict"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '')}"
    if kind == "greater_than":
        return f"expected a number greater than {ctx.get('gt')}"
    if kind in ("greater_than_equal", "less_than_equal"):
        model_field = loc[-1] if loc else ""
        if model_field == "uid":
            return "expected a uid from 1000 to 60000 (a regular, non-system user)"
        bound = ctx.get("ge", ctx.get("le"))
        word = "at least" if kind == "greater_than_equal" else "at most"
        return f"expected a number {word} {bound}"
    if kind == "string_too_short":
        return "expected a non-empty string"
    if kind in _TYPE_WORDS:
        return _TYPE_WORDS[kind]
    return f"{error['msg'][:1].lower()}{error['msg'][1:]}"


def _problems_from(exc: ValidationError, merged: Mapping, stack_host: Mapping | None) -> list:
    out: list[tuple[str, Any, str]] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, _Problems):
            items = [(loc + p.loc, p.value, p.expected) for p in cause.problems]
        else:
            found, value = _get_path(merged, loc)
            items = [(loc, value if found else error.get("input"), _expected_for(error, loc))]
        for full_loc, value, expected in items:
            if stack_host:
                in_host, _ = _get_path(stack_host, full_loc)
                if in_host:
                    expected = f"{expected}; value set in stack_host"
            field = _dotted(full_loc)
            out.append((field, value, expected))
    return out


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


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
