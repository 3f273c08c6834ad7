"""The CUDA toolkit from its runfile (toolkit only: the bundled driver would fight the pinned one).

Order: ``toolkit`` -> ``symlink`` (``/usr/local/cuda``) -> ``profile`` (``/etc/profile.d``)
-> ``verify`` (nvcc answers with the pinned release).
"""

from __future__ import annotations

import posixpath
import shlex

from jinja2.ext import Extension
from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File, Link, Sha1File
from pyinfra.operations import files

from p40fleet.facts.cuda import CudaToolkit, GccMajor, NvccRelease
from p40fleet.facts.host import FreeSpace
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.artifacts import format_bytes
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util.progress import Stopwatch
from p40fleet.operations.util.unchanged import rendered, same_file
from p40fleet.paths import FILES
from p40fleet.spec import StackSpec, cuda_release_of

__all__ = [
    "PROFILE_FILE",
    "TEMPLATE",
    "profile",
    "symlink",
    "toolkit",
    "verify",
    "survey_parts",
]

PROFILE_FILE = "/etc/profile.d/cuda.sh"
TEMPLATE = str(FILES / "cuda-profile.sh.j2")


@operation()
def toolkit(
    runfile: str,
    version: str,
    cuda_dir: str,
    tmpdir: str,
    tmp_bytes: int,
    max_gcc: int,
    allow_gcc_override: bool = False,
    force: bool = False,
):
    """
    Install the toolkit into ``cuda_dir`` unless its ``version.json`` and ``bin/nvcc`` say
    ``version``'s release is there (a tree left by a killed install has no version.json).

    + runfile: path of the verified ``cuda_X.Y.Z_DRV_linux.run`` on the host
    + version: the pinned version, e.g. ``11.8.0``
    + cuda_dir: ``--installpath``
    + tmpdir: ``--tmpdir`` (it unpacks there: not a small /tmp)
    + tmp_bytes: free bytes needed in ``tmpdir``, checked first
    + max_gcc: the newest gcc major this CUDA release installs with (``StackSpec.max_gcc``)
    + allow_gcc_override: pass ``--override`` when gcc is newer than ``max_gcc``
    + force: reinstall even when installed (policy.force_reinstall)
    """
    want = cuda_release_of(version)
    current = ask(host, CudaToolkit, cuda_dir=cuda_dir)
    if current.version and cuda_release_of(current.version) == want and current.nvcc and not force:
        host.noop(f"CUDA {current.version} is installed in {cuda_dir}")
        return
    if current.exists and not current.version:
        host.log(f"{cuda_dir} has no version.json (an interrupted install?): installing again")

    # Quoted: a spec value is never parsed by the shell (the spec refuses such characters too).
    flags = [
        "--silent",
        "--toolkit",
        StringCommand("--installpath=", QuoteString(cuda_dir), _separator=""),
        StringCommand("--tmpdir=", QuoteString(tmpdir), _separator=""),
    ]
    flags.append("--no-man-page")
    gcc = ask(host, GccMajor)
    if gcc is not None and gcc > max_gcc:
        if not allow_gcc_override:
            yield from refuse._inner(
                step=f"CUDA {version}",
                reason=f"gcc {gcc} is newer than CUDA {want} supports (gcc <= {max_gcc}): "
                "its installer stops",
                remedy=f"install gcc-{max_gcc} and make it the default gcc, or set "
                "stack.policy.allow_gcc_override=True (runs the installer with --override; "
                f"CUDA builds with gcc > {max_gcc} are unsupported)",
            )
            return
        flags.append("--override")

    space = ask(host, FreeSpace, path=tmpdir)
    free = space.available_bytes if space else None
    if free is not None and free < tmp_bytes:
        yield from refuse._inner(
            step=f"CUDA {version}",
            reason=f"not enough free space in {tmpdir} to unpack the CUDA installer: needs "
            f"{format_bytes(tmp_bytes)}, {format_bytes(free)} free, "
            f"{format_bytes(tmp_bytes - free)} missing",
            remedy=f"free {format_bytes(tmp_bytes - free)} there, or point "
            "stack.paths.artifact_cache (the installer's tmpdir) at a filesystem with room",
        )
        return

    watch = Stopwatch("CUDA install", log="/var/log/cuda-installer.log")
    yield watch.start()  # says where the (silent) installer logs, then how long it took
    yield StringCommand("mkdir -p", QuoteString(tmpdir))
    yield StringCommand("sh", QuoteString(runfile), *flags)
    yield watch.stop()


@operation()
def symlink(cuda_dir: str, cuda_link: str = "/usr/local/cuda"):
    """
    Point ``cuda_link`` at ``cuda_dir``.

    + cuda_dir: the toolkit dir, e.g. ``/usr/local/cuda-11.8``
    + cuda_link: the symlink, e.g. ``/usr/local/cuda``

    Refuses, changing nothing, when ``cuda_link`` exists and is not a symlink into a CUDA dir
    (``files.link`` would delete whatever is there: a system file, another tool's link).
    """
    current = ask(host, Link, path=cuda_link)
    if current is not None and not is_cuda_link(cuda_link, current):
        target = current.get("link_target") if current else None
        what = f"a symlink to {target}" if target else "not a symlink (a file or a directory)"
        yield from refuse._inner(
            step=f"CUDA symlink {cuda_link}",
            reason=f"{cuda_link} exists and is {what}, not a link into a CUDA dir "
            "(replacing it could break the system)",
            remedy=f"set stack.paths.cuda_link to a free path such as /usr/local/cuda, or move "
            f"{cuda_link} away by hand if it is really a stale CUDA link",
        )
        return
    if current and current.get("link_target") == cuda_dir:
        # what files.link says, from the survey's answer (files.link asks its fact live)
        host.noop(f"link {cuda_link} already exists")
        return
    yield from files.link._inner(path=cuda_link, target=cuda_dir, symbolic=True)


def is_cuda_link(link: str, info: object) -> bool:
    """True when pyinfra's ``Link`` fact ``info`` is a symlink into a CUDA toolkit dir
    (``/usr/local/cuda*`` or ``/opt/*cuda*``, relative targets resolved from the link's dir)."""
    if not isinstance(info, dict) or not info.get("link_target"):
        return False  # False: a regular file or a directory is there
    target = posixpath.normpath(posixpath.join(posixpath.dirname(link), info["link_target"]))
    top = target.split("/")[:4]  # "", "usr", "local", "cuda-11.8"
    if top[:3] == ["", "usr", "local"] and len(top) == 4:
        return "cuda" in top[3].lower()
    return top[:2] == ["", "opt"] and len(top) >= 3 and "cuda" in top[2].lower()


class ShellQuote(Extension):
    """Jinja filter ``q``: ``shlex.quote`` a value for a shell script (``{{ cuda_home | q }}``)."""

    def __init__(self, environment):
        super().__init__(environment)
        environment.filters["q"] = lambda value: shlex.quote(str(value))


@operation()
def profile(cuda_home: str, version: str, path: str = PROFILE_FILE):
    """
    Write ``/etc/profile.d/cuda.sh``: ``CUDA_HOME``, ``PATH`` and ``LD_LIBRARY_PATH``.

    + cuda_home: what ``CUDA_HOME`` names (the pinned toolkit dir)
    + version: the CUDA version, for the file's comment
    + path: the profile file
    """
    values = {"cuda_home": cuda_home.rstrip("/"), "cuda_version": version}
    jinja = {"extensions": [ShellQuote]}
    if same_file(path, rendered(TEMPLATE, jinja, **values), mode="644"):
        return
    yield from files.template._inner(
        src=TEMPLATE, dest=path, mode="644", jinja_env_kwargs=jinja, **values
    )


@operation()
def verify(cuda_dir: str, version: str):
    """
    Fail the host unless ``cuda_dir/bin/nvcc --version`` says ``version``'s release.

    + cuda_dir: the toolkit dir
    + version: the pinned version, e.g. ``11.8.0``
    """
    nvcc = ask(host, NvccRelease, cuda_dir=cuda_dir)
    if nvcc and cuda_release_of(nvcc) == cuda_release_of(version):
        host.noop(f"nvcc {nvcc} in {cuda_dir}")
        return
    yield from refuse._inner(
        step=f"CUDA {version}",
        reason=f"{cuda_dir}/bin/nvcc --version does not say release {cuda_release_of(version)} "
        f"(got {nvcc or 'no answer'})",
        remedy="read /var/log/cuda-installer.log; put 'cuda' in stack.policy.force_reinstall "
        "to install again",
    )


def survey_parts(spec: StackSpec) -> list[Part]:
    """The facts this module's operations ask on a converged host (``operations.run.survey``)."""
    paths = spec.paths
    return [
        part(CudaToolkit, cuda_dir=paths.cuda_dir),  # toolkit
        part(Link, path=paths.cuda_link),  # symlink
        part(File, path=PROFILE_FILE),  # profile (same_file)
        part(Sha1File, path=PROFILE_FILE),
        part(NvccRelease, cuda_dir=paths.cuda_dir),  # verify
    ]
