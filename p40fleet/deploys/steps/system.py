"""System layer: artifacts, nouveau out, NVIDIA driver, CUDA toolkit, cuDNN — idempotent.

    pyinfra -y inventories/sim.py deploy/system.py

A second run reports no changes. Every step decides from facts; a host that cannot go on
(unsupported GPU, cross-device cuDNN layout, no room, gcc too new, reboot needed but not
allowed) fails on its own with a remedy while the other hosts carry on.
"""

from __future__ import annotations

from p40fleet.deploys.steps import preflight as preflight_steps
from p40fleet.operations import artifacts, cuda, cudnn, driver, mirror, nouveau
from p40fleet.operations.run.spec import validated_spec
from p40fleet.runtime.included import included


def run() -> None:
    """The deploy's steps for the current host (``deploy/system.py`` calls it)."""
    # Refusals first (OS, GPUs, spec, space, mirror), also when this deploy runs alone; idempotent.
    with included("deploy/preflight.py"):
        preflight_steps.run()
    spec = validated_spec()

    if spec is None:
        return

    force = set(spec.policy.force_reinstall)
    reboot = spec.policy.allow_reboot
    paths = spec.paths
    driver_run = artifacts.artifact_path(spec, "driver")
    cuda_run = artifacts.artifact_path(spec, "cuda")
    cudnn_tar = artifacts.artifact_path(spec, "cudnn")
    cudnn_tree = cudnn.extracted_dir(paths.cudnn_extract_dir, cudnn_tar)

    # 1. Refuse what cannot work, before anything on the host changes.
    driver.supported_gpus(name="Check GPUs against the driver branch", version=spec.driver.version)
    cudnn.same_filesystem(
        name="Check cuDNN extract dir and CUDA dir share a filesystem",
        extract_dir=paths.cudnn_extract_dir,
        cuda_dir=paths.cuda_dir,
    )

    # 2. Artifacts: downloaded into the cache, sha256-verified, marked.
    for item in ("driver", "cuda", "cudnn"):
        artifacts.artifact(name=f"Fetch {spec.artifact(item).filename}", item=item, spec=spec)

    # 2b. apt from the mirror (before any apt install); air-gapped: from the mirror only.
    if spec.mirror is not None and spec.mirror.apt is not None:
        apt = spec.mirror.apt
        mirror.mirror(
            name=f"apt source: the mirror {apt.url} {apt.suite}",
            url=apt.url,
            suite=apt.suite,
            components=list(apt.components),
            key_file=apt.signed_by,
            trusted=apt.trusted,
            air_gapped=spec.mirror.air_gapped,
            extra_suites=list(apt.extra_suites),
            proxy=spec.proxy,
            lock_wait_s=spec.policy.dpkg_lock_wait_s,
        )

    # 3. Nouveau: blacklist, initramfs, reboot (only with policy.allow_reboot).
    nouveau.blacklist(name="Blacklist nouveau")
    nouveau.initramfs(name="Rebuild the initramfs after the blacklist")
    nouveau.unloaded(name="Make sure nouveau is not loaded", allow_reboot=reboot)

    # 4. NVIDIA driver.
    driver.build_prereqs(
        name="Kernel headers and build tools for the driver",
        lock_wait_s=spec.policy.dpkg_lock_wait_s,
        proxy=spec.proxy,
    )
    driver.install(
        name=f"NVIDIA driver {spec.driver.version}",
        runfile=driver_run,
        version=spec.driver.version,
        force="driver" in force,
    )
    driver.loaded(
        name="Load the new driver (reboot)", version=spec.driver.version, allow_reboot=reboot
    )
    driver.verify(name="nvidia-smi answers with the pinned driver", version=spec.driver.version)

    # 5. CUDA toolkit (never its bundled driver).
    cuda.toolkit(
        name=f"CUDA {spec.cuda.version} toolkit",
        runfile=cuda_run,
        version=spec.cuda.version,
        cuda_dir=paths.cuda_dir,
        tmpdir=paths.artifact_cache,
        tmp_bytes=spec.cuda.tmp_bytes(),
        max_gcc=spec.max_gcc,
        allow_gcc_override=spec.policy.allow_gcc_override,
        force="cuda" in force,
    )
    cuda.symlink(
        name=f"{paths.cuda_link} -> {paths.cuda_dir}",
        cuda_dir=paths.cuda_dir,
        cuda_link=paths.cuda_link,
    )
    cuda.profile(name=cuda.PROFILE_FILE, cuda_home=paths.cuda_dir, version=spec.cuda.version)
    cuda.verify(
        name="nvcc answers with the pinned release",
        cuda_dir=paths.cuda_dir,
        version=spec.cuda.version,
    )

    # 6. cuDNN: unpacked next to the CUDA dir, hard-linked into it.
    cudnn.extract(
        name=f"Unpack cuDNN {spec.cudnn.version}",
        archive=cudnn_tar,
        extract_dir=paths.cudnn_extract_dir,
        version=spec.cudnn.version,
        force="cudnn" in force,
        sha256=spec.cudnn.sha256,
    )
    cudnn.link(
        name="Hard-link cuDNN into the CUDA dir", src_dir=cudnn_tree, cuda_dir=paths.cuda_dir
    )
    cudnn.verify(
        name="cudnn_version.h says the pinned version",
        cuda_dir=paths.cuda_dir,
        version=spec.cudnn.version,
    )
