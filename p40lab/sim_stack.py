"""The Python side of the lab mirror and the stack spec that sim hosts get.

The mirror's doubles (``p40lab.mirror``) pin the NVIDIA/conda artifacts; this module adds the
wheelhouse (PEP 503 index), the git remotes (real verl 0.5.0 source, the Apex stand-in) and the
pins a lab host can actually run: the base image's python, the wheelhouse's CPU torch, Apex
without CUDA extensions. The real defaults in ``p40fleet/spec/pins.py`` stay untouched.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from p40lab import state as st
from p40lab.util import log

CACHE = st.CACHE_DIR / "downloads"


def base_python_version(base: Path = st.BASE_DIR) -> str:
    """The python3 version inside the base rootfs (what the conda double's envs run)."""
    out = subprocess.run(
        ["chroot", str(base), "python3", "-c", "import platform; print(platform.python_version())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def build_conda_channel(channel_dir: Path, python_version: str) -> dict[str, Any]:
    """A conda channel (``<channel>/linux-64/repodata.json`` + ``noarch/repodata.json``) that
    lists python ``python_version``: what the conda double resolves ``python=X.Y.Z`` from.
    Only the index: the double builds envs from the host's python, it downloads no package."""
    build = "h0_0_cpython"
    record = {
        "name": "python",
        "version": python_version,
        "build": build,
        "build_number": 0,
        "depends": [],
        "license": "Python-2.0",
        "subdir": "linux-64",
    }
    indexes = {
        "linux-64": {f"python-{python_version}-{build}.conda": record},
        "noarch": {},
    }
    for subdir, packages in indexes.items():
        (channel_dir / subdir).mkdir(parents=True, exist_ok=True)
        repodata = {
            "info": {"subdir": subdir},
            "packages": {},
            "packages.conda": packages,
            "removed": [],
            "repodata_version": 1,
        }
        (channel_dir / subdir / "repodata.json").write_text(json.dumps(repodata, indent=1) + "\n")
    return {"python": python_version}


def build_python_mirror(mirror_dir: Path, base_url: str) -> dict[str, Any]:
    """Wheelhouse + verl and apex remotes under ``mirror_dir``; returns what the spec needs."""
    from p40lab.apex_remote import build_apex_remote
    from p40lab.verl_remote import build_verl_remote
    from p40lab.wheelhouse import build_wheelhouse

    wheels = build_wheelhouse(mirror_dir, base_url=base_url)
    log(f"wheelhouse: {wheels.get('files')} wheels, {wheels['bytes'] / 2**20:.0f} MiB")
    verl = build_verl_remote(mirror_dir / "git" / "verl.git", CACHE)
    apex = build_apex_remote(mirror_dir / "git" / "apex.git", url=f"{base_url}/git/apex.git")
    for repo in ("verl.git", "apex.git"):  # dumb HTTP needs info/refs for the current tags
        subprocess.run(["git", "update-server-info"], cwd=mirror_dir / "git" / repo, check=True)
    conda = build_conda_channel(mirror_dir / "conda", base_python_version())
    return {"wheels": wheels, "verl": verl, "apex": apex, "conda": conda}


def sim_stack(artifact_pins: dict[str, Any], python: dict[str, Any], base_url: str,
              python_version: str, unpack_bytes: int,
              training: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Host data ``stack`` for sim hosts: the doubles' sums, the mirror, what the lab can run,
    and ``training`` (``p40lab.training_data``'s pins: the lab's own tiny model and dataset)."""
    artifacts = ("driver", "cuda", "cudnn", "miniconda")
    stack = {k: dict(v) for k, v in artifact_pins.items() if k in artifacts}
    # The CUDA double needs what the real runfile needs in --tmpdir, though it is small itself.
    stack["cuda"]["unpack_bytes"] = unpack_bytes
    stack["mirror"] = {
        "artifacts_url": f"{base_url}/artifacts",
        "pip_index_url": python["wheels"]["pip_index_url"],
        "pip_find_links": None,
        "git_base_url": f"{base_url}/git",
        # The hosts have no route out: apt and conda get the mirror's through the deploy (the
        # image names only the unreachable archive). The flat repo is unsigned, hence trusted.
        "apt": {"url": f"{base_url}/apt", "suite": "./", "trusted": True},
        "conda_channel": f"{base_url}/conda",
        "air_gapped": True,
    }
    stack["python_version"] = python_version
    stack["torch"] = {
        "version": python["wheels"]["torch"]["version"],
        "torchvision": None,
        "torchaudio": None,
    }
    # The Apex stand-in has no CUDA sources and lab torch is a CPU build: C++ extension only.
    stack["apex"] = {"ref": python["apex"]["ref"], "commit": python["apex"]["commit"],
                     "cuda_ext": False}  # fmt: skip
    stack["verl"] = {
        "ref": python["verl"]["ref"],
        "commit": python["verl"]["commit"],
        "version": python["verl"]["version"],
        "requirements": "lab",
    }
    # Lab hosts run bookworm's gcc 12 (CUDA 11.8 wants <= 11) and may reboot at will.
    stack["policy"] = {"allow_reboot": True, "allow_gcc_override": True}
    if training is not None:
        stack["training"] = training
    return stack
