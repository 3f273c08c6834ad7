"""Build script of the lab's Apex stand-in (p40fleet simulated lab).

Same build interface as NVIDIA/apex (tag 25.09):

* ``import torch`` at build time: an isolated build (pip without ``--no-build-isolation``)
  stops with ``ModuleNotFoundError: No module named 'torch'``;
* ``--cpp_ext`` / ``--cuda_ext`` arrive in ``sys.argv`` (pip ``--config-settings
  "--build-option=--cpp_ext"``) or as ``APEX_CPP_EXT=1`` / ``APEX_CUDA_EXT=1``;
* ``--cpp_ext`` compiles a real torch C++ extension, ``apex_C``;
* ``--cuda_ext`` needs ``nvcc`` under ``CUDA_HOME`` and stops when its release differs from
  ``torch.version.cuda``. This stand-in has no CUDA sources: with a CPU torch it stops with a
  clear error, and even with a matching CUDA torch it refuses rather than pretend;
* ``TORCH_CUDA_ARCH_LIST``, ``MAX_JOBS``, ``NVCC_APPEND_FLAGS`` are honoured where they apply
  (MAX_JOBS by torch's ninja build) and recorded in ``apex/_build_info.py``.

Every successful build prints one ``p40lab-apex-build: apex ... user=NAME`` line (p40fleet keeps
the build's output in ``/var/log/p40fleet/apex-build-KEY.log``) and appends it to
``$P40LAB_APEX_BUILD_LOG``, else ``/var/log/p40lab-apex-builds.log`` when writable, else
``~/.p40lab-apex-builds.log``.
"""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch  # build-time dependency, exactly like apex: needs --no-build-isolation
from setuptools import find_packages, setup
from setuptools.command.build import build
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, is_ninja_available

VERSION = "0.1"
HERE = Path(__file__).resolve().parent
BUILD_LOG = "/var/log/p40lab-apex-builds.log"


def _requested(flag, env):
    """True when ``flag`` is in sys.argv (removed, setuptools must not see it) or env=1."""
    found = flag in sys.argv
    while flag in sys.argv:
        sys.argv.remove(flag)
    return found or os.environ.get(env, "0").strip() not in ("", "0")


def nvcc_release(cuda_dir):
    """(raw ``nvcc -V`` output, "major.minor") of the toolkit at ``cuda_dir``."""
    nvcc = os.path.join(cuda_dir, "bin", "nvcc")
    try:
        raw = subprocess.check_output([nvcc, "-V"], text=True, stderr=subprocess.STDOUT)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(
            f"--cuda_ext was requested, but {nvcc} could not be run ({exc}). "
            "Set CUDA_HOME to an installed CUDA toolkit."
        ) from exc
    match = re.search(r"release (\d+)\.(\d+)", raw)
    if not match:
        raise RuntimeError(f"could not read the CUDA release from `{nvcc} -V`:\n{raw}")
    return raw, f"{match.group(1)}.{match.group(2)}"


def check_cuda_toolkit_matches_torch(cuda_dir):
    raw, bare_metal = nvcc_release(cuda_dir)
    print(f"nvcc under {cuda_dir}: release {bare_metal}")
    if torch.version.cuda is None:
        raise RuntimeError(
            f"--cuda_ext was requested, but the installed torch {torch.__version__} has no CUDA "
            f"support (torch.version.cuda is None), so CUDA extensions cannot be compiled against "
            f"it (nvcc under {cuda_dir} is release {bare_metal}). Install the CUDA build of torch "
            f"that matches this toolkit, or build with --cpp_ext only."
        )
    torch_cuda = ".".join(torch.version.cuda.split(".")[:2])
    if torch_cuda != bare_metal:
        raise RuntimeError(
            "Cuda extensions are being compiled with a version of Cuda that does not match the "
            f"version used to compile Pytorch binaries. Pytorch binaries were compiled with Cuda "
            f"{torch.version.cuda}, but nvcc under CUDA_HOME={cuda_dir} is release {bare_metal}. "
            "Point CUDA_HOME at the toolkit torch was built with (a minor-version mismatch is "
            "sometimes harmless, but this check does not guess)."
        )
    return bare_metal


print(f"\n\ntorch.__version__ = {torch.__version__}\n\n")

cpp_ext = _requested("--cpp_ext", "APEX_CPP_EXT")
cuda_ext = _requested("--cuda_ext", "APEX_CUDA_EXT")

if not torch.cuda.is_available():
    print(
        "Warning: torch sees no GPU on this machine. That is fine for a cross-compile; "
        "TORCH_CUDA_ARCH_LIST decides which architectures CUDA code would target."
    )

# torch's CUDA_HOME is None for a build without CUDA even when a toolkit is present; fall back
# to the environment so a CPU torch meets the clearer "torch has no CUDA" error below.
cuda_home = CUDA_HOME or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
cuda_release = None
if cuda_ext:
    if cuda_home is None:
        raise RuntimeError(
            "--cuda_ext was requested, but nvcc was not found. Is a CUDA toolkit installed and "
            "CUDA_HOME set (or nvcc on PATH)?"
        )
    cuda_release = check_cuda_toolkit_matches_torch(cuda_home)
    raise RuntimeError(
        f"--cuda_ext: nvcc {cuda_release} matches torch, but this is the p40fleet lab's Apex "
        "stand-in: it carries no CUDA sources (amp_C, fused_layer_norm_cuda, ...). Build it with "
        "--cpp_ext only; use NVIDIA/apex for CUDA extensions."
    )

ext_modules = []
if cpp_ext:
    ext_modules.append(CppExtension("apex_C", ["csrc/flatten_unflatten.cpp"]))

BUILD_INFO = {
    "name": "apex",
    "version": VERSION,
    "standin": True,
    "cpp_ext": cpp_ext,
    "cuda_ext": cuda_ext,
    "extensions": [e.name for e in ext_modules],
    "torch_version": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "cuda_home": cuda_home,
    "nvcc_release": cuda_release,
    "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST"),
    "MAX_JOBS": os.environ.get("MAX_JOBS"),
    "NVCC_APPEND_FLAGS": os.environ.get("NVCC_APPEND_FLAGS"),
    "ninja": is_ninja_available(),
    "python": sys.executable,
    "host": socket.gethostname(),
    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
}


def _build_log_path():
    explicit = os.environ.get("P40LAB_APEX_BUILD_LOG")
    if explicit:
        return explicit
    target = Path(BUILD_LOG)
    if os.access(target if target.exists() else target.parent, os.W_OK):
        return str(target)
    return str(Path.home() / ".p40lab-apex-builds.log")


def record_build():
    line = " ".join(
        f"{k}={BUILD_INFO[k]}"
        for k in (
            "built_at",
            "host",
            "version",
            "cpp_ext",
            "cuda_ext",
            "TORCH_CUDA_ARCH_LIST",
            "MAX_JOBS",
            "torch_version",
            "python",
        )
    )
    import pwd

    entry = f"apex {line} user={pwd.getpwuid(os.getuid()).pw_name} pid={os.getpid()}"
    # also in the build's output (pip -v): p40fleet keeps it in /var/log/p40fleet/apex-build-*
    print(f"p40lab-apex-build: {entry}", flush=True)
    path = _build_log_path()
    try:
        with open(path, "a") as f:
            f.write(f"{entry}\n")
    except OSError as exc:
        print(f"warning: could not append to the build log {path}: {exc}")


class build_py_with_info(build_py):
    """Writes apex/_build_info.py (what this build used) into the build tree."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "apex" / "_build_info.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(
            '"""Written by setup.py at build time."""\n\nBUILD_INFO = ' + repr(BUILD_INFO) + "\n"
        )


class build_and_record(build):
    """The normal build, then one line in the build log (only when it succeeded)."""

    def run(self):
        super().run()
        record_build()


setup(
    name="apex",
    version=VERSION,
    description="PyTorch Extensions written by NVIDIA (p40fleet lab stand-in)",
    packages=find_packages(include=["apex", "apex.*"]),
    ext_modules=ext_modules,
    cmdclass={
        "build_ext": BuildExtension,
        "build_py": build_py_with_info,
        "build": build_and_record,
    },
)
