"""The pins: what a P40 host gets, as validated models whose defaults are the real pins.

This file is the project's ``defaults/main.yml``: every default below is the real pin of the
real-lab stack (``docs/stack-facts.md`` §1), so an empty ``stack`` dict is a complete, correct
spec. A new pin (a CUDA release, say) is changed here and nowhere else: every value that depends
on a pin is derived on :class:`StackSpec` (``cuda_release``, ``max_gcc``, ``driver_branch``,
``gpu_summary``, ``requirements_variant``).

==================  =========================================================================
pin                 default (model.field)
==================  =========================================================================
NVIDIA driver       525.147.05 runfile, the last R525 (``DriverArtifact``)
CUDA                11.8.0 runfile, toolkit in /usr/local/cuda-11.8 (``CudaArtifact``, ``Paths``)
newest gcc          11, for CUDA 11.8 (``GCC_MAX``; a new CUDA release adds its row)
cuDNN               8.9.7.29 for CUDA 11 (``CudnnArtifact``)
Miniconda           py310_24.11.1-0 (``MinicondaArtifact``), env verl-p40 (``PythonEnv``)
Python              3.10.12 (``StackSpec.python_version``)
PyTorch             2.6.0+cu118 and its closure; torchvision/torchaudio opt-in (``TorchPin``)
Apex                tag 25.09, 4bdecd06... (``ApexPin``)
verl                tag v0.5.0, 8fdc4d3f... (``VerlPin``); requirements lock v0.5.0
                    (``VERL_REQUIREMENTS_CUDA``; ``lab`` for a CPU torch)
training user       verl, uid 2001, /home/verl (``TrainingUser``)
OS                  Ubuntu 20.04 (22.04 also supported: ``SUPPORTED_OS``)
==================  =========================================================================

Fields, their defaults and the values derived from them (a default that follows another field,
such as the home from the user name, is a default here): field types and their validators are
in ``fields.py``, the rules across fields in ``rules.py``, error wording in ``errors.py``,
loading from pyinfra host data in ``load.py``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from packaging.version import Version
from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, model_validator
from pydantic_core import PydanticUndefined

from p40fleet.profile import HostGpuSummary, summarize_host
from p40fleet.spec import rules
from p40fleet.spec.fields import (
    _APT_WORD,
    _FROZEN,
    AbsPath,
    BaseUrl,
    FileName,
    GitCommit,
    GitRef,
    HttpUrl,
    Pep440,
    Port,
    Sha256,
    TarArchiveName,
    _host_address,
    _ip,
    _pattern,
    _python_version,
    _python_version_text,
    _url_or_abs_path,
)
from p40fleet.spec.proxy import Proxy

if TYPE_CHECKING:  # p40fleet.apex_build reads the spec: imported lazily, no cycle
    from p40fleet.apex_build import ApexBuild

__all__ = [
    "ARTIFACTS",
    "COMPONENTS",
    "GCC_MAX",
    "GIT_PINS",
    "SUPPORTED_OS",
    "VERL_REQUIREMENTS_CPU",
    "VERL_REQUIREMENTS_CUDA",
    "ApexPin",
    "AptMirror",
    "Artifact",
    "Proxy",
    "CudaArtifact",
    "CudnnArtifact",
    "DriverArtifact",
    "GitPin",
    "MinicondaArtifact",
    "Mirror",
    "Paths",
    "Policy",
    "PythonEnv",
    "RayCluster",
    "StackSpec",
    "TorchPin",
    "TorchSums",
    "Training",
    "TrainingArchive",
    "TrainingData",
    "TrainingModel",
    "TrainingUser",
    "VerlPin",
    "cuda_release_of",
]

#: The OS releases (``facts.host.os_label``) the driver and CUDA pins are meant for: the seed
#: targets Ubuntu 20.04; CUDA 11.8 and R525 also support 22.04. The preflight refuses others.
SUPPORTED_OS: tuple[str, ...] = ("Ubuntu 20.04", "Ubuntu 22.04")

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


#: PyPI, the rest of the torch closure when no mirror is set (the torch index lacks new pins).
PYPI_SIMPLE = "https://pypi.org/simple"

#: The newest gcc (major) each CUDA release's runfile installs with, by release X.Y; a newer gcc
#: needs ``--override``. Only rows with a source: 11.8 -> 11 (docs/stack-facts.md §4, "CUDA 11.8
#: wants gcc <= 11"). A release missing here is an error (``StackSpec.max_gcc``), never a guess:
#: add its row with the pin, from that release's Installation Guide for Linux (NVIDIA's table of
#: supported compilers).
GCC_MAX: dict[str, int] = {"11.8": 11}

#: The verl requirements lock (``files/verl-requirements-<variant>.txt``) for a CUDA torch pin,
#: and for a CPU torch (the simulated lab's); ``verl.requirements`` overrides both.
VERL_REQUIREMENTS_CUDA = "v0.5.0"
VERL_REQUIREMENTS_CPU = "lab"

#: Accounts every Ubuntu 20.04 server has (base-passwd, systemd, the server seed) or that a
#: lab's deploy account is called: never the training user (it runs untrusted code).
SYSTEM_ACCOUNTS: frozenset[str] = frozenset(
    ("root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
     "proxy", "www-data", "backup", "list", "irc", "gnats", "nobody", "messagebus", "syslog",
     "tss", "uuidd", "tcpdump", "landscape", "pollinate", "sshd", "lxd", "usbmux", "dnsmasq",
     "ntp", "postfix", "admin", "operator", "adm", "sudo", "wheel", "staff", "users")
)  # fmt: skip
# Default locations of the env paths, relative to user.home.
_ENV_SUBDIRS = {
    "conda_prefix": "miniconda3",
    "verl_checkout": "verl",
    "data_dir": "data",
    "model_dir": "models",
}


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
    """sha256 of torch index wheels, for lock lines that carry none (see ``TorchPin.sha256``).

    ``triton``: the sum of the triton file a mirror serves when it is the PyTorch index's
    (``…manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl``), added to the lock's triton line
    beside PyPI's (the lock's header says which file each sum is for).
    """

    model_config = _FROZEN

    torch: Sha256 | None = None
    torchvision: Sha256 | None = None
    torchaudio: Sha256 | None = None
    triton: Sha256 | None = None

    def given(self) -> dict[str, str]:
        """``{distribution: sha256}`` of the sums set."""
        return {name: value for name, value in self.model_dump().items() if value}


class TorchPin(BaseModel):
    """torch (+ torchvision, torchaudio when pinned), installed together from one index (they
    must match each other) with torch's closure from the hash-locked file."""

    model_config = _FROZEN

    version: Pep440 = "2.6.0+cu118"
    # Opt-in (None: not installed): verl v0.5.0's text PPO path imports neither, and no cp310
    # sum of the +cu118 wheels is published where we could read it. Pin them (e.g.
    # "0.21.0+cu118", "2.6.0+cu118") together with their sums in sha256 (the preflight refuses
    # a pin whose lock line has no sum).
    torchvision: Pep440 | None = None
    torchaudio: Pep440 | None = None
    index_url: BaseUrl = "https://download.pytorch.org/whl/cu118"
    # {distribution: sha256} for torch/torchvision/torchaudio wheels whose sum the lock file
    # (files/torch-requirements-<variant>.txt) does not carry, and a second triton sum; the
    # preflight refuses a pinned package whose line has none.
    sha256: TorchSums = Field(default_factory=lambda: TorchSums())

    def pins(self) -> dict[str, str]:
        """``{distribution: version}`` the torch step installs: torch, and the opt-ins pinned."""
        extras = {"torchvision": self.torchvision, "torchaudio": self.torchaudio}
        return {"torch": self.version, **{name: pin for name, pin in extras.items() if pin}}


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
    def _rules(self) -> Paths:
        return rules.check_paths(self)


def _not_system_account(name: str) -> str:
    if name in SYSTEM_ACCOUNTS or name.startswith(("systemd-", "_")):
        raise ValueError(
            "expected the name of a dedicated training account such as verl, not a system or "
            "administrator account (the training user runs code p40fleet does not vet)"
        )
    return name


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
        AfterValidator(_not_system_account),
    ] = "verl"
    uid: int = Field(default=2001, ge=1000, le=60000)
    home: AbsPath = "/home/verl"

    @model_validator(mode="after")
    def _rules(self) -> TrainingUser:
        return rules.check_user(self)


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


class AptMirror(BaseModel):
    """The mirror's apt repository: one ``deb`` line in sources.list.d/p40fleet-mirror.list.

    ``suite`` ending in ``/`` is a flat repository (``deb URL ./``, no components), as apt
    defines it. apt checks signatures unless told not to: ``signed_by`` is the repository's key
    file on the controller (binary ``.gpg`` or armored ``.asc``), which the deploy ships to
    ``/etc/apt/keyrings/``; ``trusted: True`` (apt's ``[trusted=yes]``) turns the check off and
    is never implied. Over ``http://`` it lets whoever is on the network path between the host
    and the mirror choose the packages root installs (kernel headers, gcc, dkms): use it only
    for a mirror on a network you trust (the simulated lab's), or over https.
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
    def _rules(self) -> AptMirror:
        return rules.check_apt_mirror(self)


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
    # Artifacts (driver, CUDA, cuDNN, Miniconda) reach the hosts from the controller over SSH,
    # for labs without an HTTP server the hosts can reach: the controller fetches each one once
    # per run into its cache ($P40FLEET_CACHE/artifacts/, from artifacts_url or upstream; a file
    # put there by hand is used), checks its sha256, uploads it; each host checks it again.
    push_from_controller: bool = False

    @model_validator(mode="after")
    def _rules(self) -> Mirror:
        return rules.check_mirror(self)


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
    # A plain-http mirror.conda_channel: the env's files are still checked against the lock's
    # sums (files/conda-env-<variant>.txt), but the transport is not authenticated.
    allow_http_conda_channel: bool = False
    # How long every apt step waits for the dpkg lock (unattended-upgrades holds it after boot)
    # before it fails naming the holder; seconds.
    dpkg_lock_wait_s: int = Field(default=600, ge=1, le=3600)
    # What deploy/uninstall.py does with the training user: "keep" its account and home (the env,
    # the checkout, models, data, checkpoints); "remove": the home's contents deleted as that
    # user, then the empty home, the account and its group (docs/footprint.md).
    uninstall_home: Literal["keep", "remove"] = "keep"


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
    # Every member runs with Ray's token authentication (RAY_AUTH_MODE=token, the cluster's
    # token from the controller); the dashboard (and its Jobs API, which runs code) still
    # listens on the head's loopback (reach it with ssh -L); another address opens it to that
    # network (its HTTP API asks for the token too).
    dashboard_host: Annotated[str, AfterValidator(_ip)] = "127.0.0.1"
    dashboard_port: Port = 8265
    # Nodes verify expects in the cluster; None: every host of the inventory.
    nodes: int | None = Field(default=None, ge=1)
    # Ray's --temp-dir (session dirs, logs); Ray's own default.
    temp_dir: AbsPath = "/tmp/ray"
    # The Ray Client server (ray://HEAD:port, a remote driver) on the head: off unless asked
    # (``ray start`` binds it on the head's address and loopback, port 10001, whenever grpcio is
    # installed, as it is with ray[default]); with token authentication it asks for the token.
    client_server: bool = False
    client_server_port: Port = 10001
    # verify --collective: the TCP port of the all-reduce's rendezvous (a torch.distributed
    # TCP store the check holds on the head for the time of the check; torchrun's default).
    collective_port: Port = 29500
    # verify --collective FAILs when the group's bus bandwidth (nccl-tests' busbw) at the
    # largest message is under this, in GB/s (1e9 bytes). 0.05 GB/s = 400 Mbit/s: a 1 GbE link
    # (~0.11 GB/s busbw) passes, a 100 Mbit one does not.
    collective_min_busbw_gbs: float = Field(default=0.05, gt=0, le=10000)

    @model_validator(mode="after")
    def _rules(self) -> RayCluster:
        return rules.check_ray(self)


class TrainingArchive(BaseModel):
    """A tar archive of a model or data directory: fetched, sha256-checked, then unpacked.

    Named for a format focal's tar 1.30 reads (plain, gz, bz2, xz; ``fields.TAR_SUFFIXES``).

    From ``mirror.artifacts_url/<filename>`` when the mirror is set, else from ``url``.
    """

    model_config = _FROZEN

    # unpacked with the host's tar (focal: 1.30): gz, bz2, xz or plain, never zstd
    filename: TarArchiveName
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

    @model_validator(mode="after")
    def _rules(self) -> TrainingData:
        return rules.check_training_data(self)


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
    python_version: Annotated[
        str, BeforeValidator(_python_version_text), AfterValidator(_python_version)
    ] = "3.10.12"
    torch: TorchPin = Field(default_factory=TorchPin)
    apex: ApexPin = Field(default_factory=ApexPin)
    verl: VerlPin = Field(default_factory=VerlPin)
    paths: Paths = Field(default_factory=Paths)
    user: TrainingUser = Field(default_factory=TrainingUser)
    env: PythonEnv = Field(default_factory=PythonEnv)
    mirror: Mirror | None = None
    proxy: Proxy | None = None
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
    def _rules(self) -> StackSpec:
        return rules.check_stack(self, ARTIFACTS, GIT_PINS, _ENV_SUBDIRS)

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

    @property
    def cuda_release(self) -> str:
        """The CUDA release X.Y of the pin, e.g. ``"11.8"`` for 11.8.0 (what nvcc reports)."""
        return cuda_release_of(self.cuda.version)

    @property
    def max_gcc(self) -> int:
        """The newest gcc major the pinned CUDA release installs with (11 for CUDA 11.8).

        Raises ``LookupError`` for a release :data:`GCC_MAX` does not list.
        """
        release = self.cuda_release
        if release not in GCC_MAX:
            known = ", ".join(sorted(GCC_MAX))
            raise LookupError(
                f"stack.cuda.version = {self.cuda.version!r}: p40fleet does not know the newest "
                f"gcc CUDA {release} supports (known releases: {known}); add CUDA {release}'s "
                "row to GCC_MAX in p40fleet/spec/pins.py from NVIDIA's Installation Guide for "
                "Linux (supported compilers), or pin a known release"
            )
        return GCC_MAX[release]

    @property
    def torch_is_cuda(self) -> bool:
        """Whether the torch pin is a CUDA build (local label ``cuXYZ``, as in 2.6.0+cu118)."""
        return (Version(self.torch.version).local or "").lower().startswith("cu")

    @property
    def requirements_variant(self) -> str:
        """The ``<variant>`` of files/{torch,verl}-requirements-<variant>.txt this spec installs.

        ``verl.requirements`` when set; else the CUDA lock for a CUDA torch pin, the lab's
        lock for a CPU torch (the simulated lab's).
        """
        if self.verl.requirements:
            return self.verl.requirements
        return VERL_REQUIREMENTS_CUDA if self.torch_is_cuda else VERL_REQUIREMENTS_CPU

    def gpu_summary(self, gpus: Iterable[int | object]) -> HostGpuSummary:
        """The host's GPU summary (profile, refusal) under this spec's driver branch and policy.

        ``gpus``: PCI facts (``PciGpu``), objects with ``device_id``, or device ids.
        """
        return summarize_host(
            gpus, branch=self.driver_branch, allow_maxwell=self.policy.allow_maxwell
        )

    def apex_build(self, gpus: Iterable[Any]) -> ApexBuild:
        """The Apex build (key, arch list, extensions) this spec needs on ``gpus`` (PCI facts)."""
        from p40fleet.apex_build import for_spec  # pure; it reads the spec, never builds one

        return for_spec(self, gpus)

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


def cuda_release_of(version: str) -> str:
    """``11.8.0`` / ``11.8.20220929`` / ``11.8.89`` -> ``11.8``: the release X.Y of a version."""
    return ".".join(version.split(".")[:2])


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
