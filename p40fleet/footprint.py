"""What a p40fleet run leaves on a host, and how ``deploy/uninstall.py`` undoes each thing.

:data:`FOOTPRINT` is the one declared list: ``docs/footprint.md`` is rendered from it
(``python -m p40fleet.footprint --write``; ``tests/test_footprint.py`` fails when they differ)
and ``deploy/uninstall.py`` walks it, one operation per :attr:`Item.undo` kind, so the doc and
the undo cannot drift: an item whose kind the uninstall does not handle fails that test.

``where`` is a template over :func:`places` (``{cuda_dir}``, ``{home}``...): the doc shows it
with the spec's defaults and names the setting that moves it.
"""

from __future__ import annotations

import posixpath
import re
import sys
from dataclasses import dataclass

from p40fleet import gendoc
from p40fleet.apex_build import BUILD_ACCOUNT, BUILD_HOME, BUILD_LOG_DIR
from p40fleet.gendoc import cell
from p40fleet.paths import REPO
from p40fleet.privdrop import STAGE_DIR
from p40fleet.proxy import PROXY_DIR, PROXY_FILE
from p40fleet.ray import TOKEN_FILE, UNIT_NAME, UNIT_PATH
from p40fleet.run_lock import DEFAULT_PATH as RUN_LOCK
from p40fleet.spec import StackSpec

__all__ = [
    "DOC", "FOOTPRINT", "UNDO_KINDS", "Item", "items", "places", "render", "settings_of",
]  # fmt: skip

DOC = REPO / "docs" / "footprint.md"

# The same paths as the operations that write them (tests/test_footprint.py checks each one
# against its operation's constant: operations/ is not importable from the p40fleet package).
BLACKLIST_FILE = "/etc/modprobe.d/blacklist-nouveau.conf"
PROFILE_FILE = "/etc/profile.d/cuda.sh"
MIRROR_LIST = "/etc/apt/sources.list.d/p40fleet-mirror.list"
MIRROR_KEYS = ("/etc/apt/keyrings/p40fleet-mirror.gpg", "/etc/apt/keyrings/p40fleet-mirror.asc")
ASIDE_DIR = "/etc/apt/p40fleet-aside"
BUILD_PACKAGES = ("dkms", "build-essential", "pkg-config", "libglvnd-dev")
STATE_DIR = posixpath.dirname(RUN_LOCK)  # /var/lib/p40fleet

#: What deploy/uninstall.py does with an item (operations/uninstall.py has one operation each):
UNDO_KINDS = {
    "driver": "`nvidia-uninstall --silent` (the runfile's own uninstaller; without it "
    "`sh RUNFILE --uninstall --silent` from the cache), reboot to unload the module",
    "ray_unit": "stopped, disabled, removed, `systemctl daemon-reload`",
    "nouveau": "removed, then `update-initramfs -u` (nouveau is back after a reboot)",
    "cuda_link": "removed only while it is a symlink to the CUDA dir",
    "remove": "removed as root (root-owned, outside every home): a tree with `rm -rf "
    "--one-file-system`, a symlink itself, never its target",
    "apt_mirror": "removed (`apt-get update` is left to you: the archive may be unreachable)",
    "apt_aside": "each file moved back to where it was; one whose place is taken again stays, "
    "with a note",
    "account": "`userdel` when present (a build killed before its clean-up)",
    "home": "kept with `stack.policy.uninstall_home: keep` (default); `remove`: the home's "
    "contents deleted as the training user, then the empty home `rmdir`ed, `userdel`, `groupdel`",
    "released": "released by the uninstall run itself at its end (the empty dir stays)",
    "kept": "kept (see why)",
}


@dataclass(frozen=True)
class Item:
    """One thing a run leaves: ``what`` it is, ``where`` (a template over :func:`places`),
    the step that ``made`` it, how it is undone (a key of :data:`UNDO_KINDS`) and ``why``
    (what the doc says beside the undo)."""

    what: str
    where: str
    made: str
    undo: str
    why: str = ""

    def path(self, spec: StackSpec) -> str:
        return self.where.format(**places(spec))


_SETTINGS = {
    "cuda_dir": "paths.cuda_dir",
    "cuda_link": "paths.cuda_link",
    "cudnn_tree": "paths.cudnn_extract_dir",
    "cache": "paths.artifact_cache",
    "user": "user.name",
    "home": "user.home",
    "ray_temp": "ray.temp_dir",
}


def places(spec: StackSpec) -> dict[str, str]:
    """The values the templates of :data:`FOOTPRINT` use, from ``spec``."""
    name = spec.cudnn.filename
    for suffix in (".tar.xz", ".tar.gz", ".tgz", ".tar"):  # operations.cudnn.extracted_dir
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return {
        "cuda_dir": spec.paths.cuda_dir,
        "cuda_link": spec.paths.cuda_link,
        "cudnn_tree": posixpath.join(spec.paths.cudnn_extract_dir, name),
        "cache": spec.paths.artifact_cache,
        "user": spec.user.name,
        "uid": str(spec.user.uid),
        "home": spec.user.home,
        "driver": spec.driver.version,
        "ray_temp": spec.ray.temp_dir,
    }


def settings_of(item: Item) -> list[str]:
    """The ``stack`` settings that move ``item`` (``{cuda_dir}`` -> ``paths.cuda_dir``)."""
    return [_SETTINGS[k] for k in re.findall(r"{(\w+)}", item.where) if k in _SETTINGS]


FOOTPRINT: tuple[Item, ...] = (
    Item(
        "NVIDIA driver {driver}: nvidia.ko through DKMS, nvidia-smi, libnvidia-*, "
        + "nvidia-uninstall",
        "/usr/bin/nvidia-uninstall",
        "system: driver.install",
        "driver",
    ),
    Item(
        "driver build packages: linux-headers-$(uname -r), " + ", ".join(BUILD_PACKAGES),
        "dpkg",
        "system: driver.build_prereqs",
        "kept",
        "other software may need them and dpkg cannot tell who asked: "
        "`apt-get remove` them yourself",
    ),
    Item(
        "nouveau blacklist, and the initramfs rebuilt with it",
        BLACKLIST_FILE,
        "system: nouveau.blacklist, nouveau.initramfs",
        "nouveau",
    ),
    Item(
        "CUDA toolkit tree (cuDNN's hard links inside it)",
        "{cuda_dir}",
        "system: cuda.toolkit, cudnn.link",
        "remove",
    ),
    Item("CUDA symlink", "{cuda_link}", "system: cuda.symlink", "cuda_link"),
    Item("CUDA profile script (PATH, CUDA_HOME)", PROFILE_FILE, "system: cuda.profile", "remove"),
    Item("cuDNN unpacked tree", "{cudnn_tree}", "system: cudnn.extract", "remove"),
    Item(
        "NVIDIA installer logs",
        "/var/log/nvidia-installer.log, /var/log/cuda-installer.log",
        "system: driver.install, cuda.toolkit",
        "kept",
        "NVIDIA's own logs, for the admin",
    ),
    Item(
        "apt source of the mirror, and its signed-by key (" + " or ".join(MIRROR_KEYS) + ")",
        MIRROR_LIST,
        "system: mirror.mirror",
        "apt_mirror",
    ),
    Item(
        "the distribution's apt sources moved aside (air-gapped)",
        ASIDE_DIR,
        "system: mirror.mirror",
        "apt_aside",
    ),
    Item(
        "artifact cache: runfiles, cuDNN archive, Miniconda installer, locks, Apex sums",
        "{cache}",
        "preflight, system, python",
        "remove",
    ),
    Item(
        f"p40fleet's root-only config: proxy credentials ({posixpath.basename(PROXY_FILE)}), "
        f"the Ray cluster token ({posixpath.basename(TOKEN_FILE)})",
        PROXY_DIR,
        "preflight: proxy.credentials, ray: ray_member",
        "remove",
    ),
    Item(f"Ray member unit {UNIT_NAME}", UNIT_PATH, "ray: ray_member", "ray_unit"),
    Item(
        "Ray's session dirs and logs",
        "{ray_temp}",
        "the Ray member (as the training user)",
        "kept",
        "the training user's files in a tmp dir: systemd-tmpfiles clears them",
    ),
    Item(
        "root's staging dir for uploads to the training user",
        STAGE_DIR,
        "python: put_as, apex.build_wheel",
        "remove",
    ),
    Item("Apex build home (only during a build)", BUILD_HOME, "python: apex.build_wheel", "remove"),
    Item(
        f"Apex build account {BUILD_ACCOUNT} (only during a build)",
        BUILD_ACCOUNT,
        "python: apex.build_wheel",
        "account",
    ),
    Item("Apex build logs", BUILD_LOG_DIR, "python: apex.build_wheel", "remove"),
    Item("run lock", RUN_LOCK, "every deploy (operations.run_lock)", "released"),
    Item("training user and group (fixed uid {uid})", "{user}", "python: training_user", "home"),
    Item(
        "training user's home: Miniconda and the env, verl checkout, model, data, "
        "~/launch-ppo.sh, ~/.cache/p40fleet (Apex wheel, patch work)",
        "{home}",
        "python, training (as the training user)",
        "home",
    ),
)


def items(spec: StackSpec, undo: str | None = None) -> list[Item]:
    """The items of :data:`FOOTPRINT` (those undone by ``undo`` when given)."""
    return [item for item in FOOTPRINT if undo is None or item.undo == undo]


def render(spec: StackSpec | None = None) -> str:
    spec = spec or StackSpec()
    values = places(spec)
    lines = [
        "# What a run leaves on a host, and what `deploy/uninstall.py` does with it",
        "",
        "Generated from `p40fleet/footprint.py` (the list `deploy/uninstall.py` walks) by",
        "`python -m p40fleet.footprint --write`; `tests/test_footprint.py` keeps it in sync.",
        "Paths are the spec's defaults; the setting named beside one moves it.",
        "`pyinfra INVENTORY deploy/uninstall.py` undoes every row but the kept ones; a second",
        "uninstall changes nothing; `deploy/full.py` converges the host again.",
        f"{len(FOOTPRINT)} rows.",
        "",
        "| what | where | made by | uninstall |",
        "|---|---|---|---|",
    ]
    for item in FOOTPRINT:
        moved = ", ".join(f"`stack.{s}`" for s in settings_of(item))
        where = f"`{item.where.format(**values)}`" + (f" ({moved})" if moved else "")
        undo = UNDO_KINDS[item.undo] if item.undo != "kept" else "kept"
        if item.why:
            undo += f": {item.why}"
        lines.append(
            f"| {cell(item.what.format(**values))} | {cell(where)} | {cell(item.made)} "
            f"| {cell(undo)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return gendoc.main("p40fleet.footprint", lambda: {DOC: render()}, argv)


if __name__ == "__main__":
    sys.exit(main())
