"""cuDNN from NVIDIA's tarball: extracted once, hard-linked into the CUDA dir.

Hard links need one filesystem: the extract dir and the CUDA dir must have the same
``stat -c %d``. ``same_filesystem`` checks that before anything changes (put it early).
Links: ``include/cudnn*.h`` -> ``<cuda_dir>/include``, ``lib/libcudnn*`` -> ``<cuda_dir>/lib64``.
"""

from __future__ import annotations

import posixpath

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from p40fleet.facts.artifacts import UnsafeParent
from p40fleet.facts.cudnn import (
    CudnnExtracted,
    CudnnFiles,
    CudnnHeaderVersion,
    PathDevice,
    cudnn_marker_path,
)
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.artifacts import artifact_path, parent_remedy
from p40fleet.operations.refuse import refuse
from p40fleet.spec import StackSpec

__all__ = ["extract", "extracted_dir", "link", "same_filesystem", "verify", "survey_parts"]

_ARCHIVE_SUFFIXES = (".tar.xz", ".tar.gz", ".tgz", ".tar")
#: Where each source dir of the tarball goes in the CUDA dir.
_DEST_DIRS = {"include": "include", "lib": "lib64"}


def extracted_dir(extract_dir: str, archive: str) -> str:
    """``/usr/local/src`` + ``.../cudnn-X-archive.tar.xz`` -> ``/usr/local/src/cudnn-X-archive``."""
    name = posixpath.basename(archive)
    for suffix in _ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return posixpath.join(extract_dir, name)


def _short(version: str) -> str:
    """``8.9.7.29`` -> ``8.9.7`` (what cudnn_version.h holds)."""
    return ".".join(version.split(".")[:3])


@operation()
def same_filesystem(extract_dir: str, cuda_dir: str):
    """
    Refuse the host when ``extract_dir`` and ``cuda_dir`` are on different filesystems.

    + extract_dir: where the tarball is unpacked (spec.paths.cudnn_extract_dir)
    + cuda_dir: the CUDA toolkit dir (a path not created yet counts as its parent's)
    """
    src = ask(host, PathDevice, path=extract_dir)
    dst = ask(host, PathDevice, path=cuda_dir)
    if src is not None and dst is not None and src != dst:
        yield from refuse._inner(
            step="cuDNN hard links",
            reason=f"{extract_dir} (device {src}) and {cuda_dir} (device {dst}) are on "
            "different filesystems: hard links between them fail (Invalid cross-device link)",
            remedy="set stack.paths.cudnn_extract_dir to a directory on the filesystem of "
            f"{cuda_dir} (e.g. {posixpath.dirname(cuda_dir.rstrip('/'))}/src)",
        )
        return
    host.noop(f"{extract_dir} and {cuda_dir} share a filesystem")


@operation()
def extract(
    archive: str, extract_dir: str, version: str, force: bool = False, sha256: str | None = None
):
    """
    Unpack the cuDNN tarball under ``extract_dir`` unless that version is completely there.

    tar writes into ``<tree>.partial``; only after it exited 0 is the tree renamed into place
    and its completion marker (the archive's sha256) written. A tree without that marker (an
    interrupted extract, or one from before the marker existed) is unpacked again.

    + archive: path of the verified tarball on the host
    + extract_dir: parent dir of the unpacked tree
    + version: the pinned version, e.g. ``8.9.7.29``
    + force: unpack again (policy.force_reinstall)
    + sha256: the archive's pinned sum; a marker naming another archive means unpack again

    Refuses the host when another account than root could rename ``extract_dir`` or a
    directory above it (``facts.artifacts.UnsafeParent``).
    """
    tree = extracted_dir(extract_dir, archive)
    unsafe = ask(host, UnsafeParent, path=extract_dir)
    if unsafe:
        yield from refuse._inner(
            step="cuDNN extract",
            reason=f"{extract_dir}: {unsafe}: that account could swap the tree root hard-links "
            "into the CUDA dir (S7)",
            remedy=parent_remedy(unsafe, "stack.paths.cudnn_extract_dir"),
        )
        return
    found = ask(host, CudnnHeaderVersion, path=f"{tree}/include/cudnn_version.h")
    marker = ask(host, CudnnExtracted, tree=tree)
    complete = marker is not None and (sha256 is None or marker == sha256.lower())
    if found == _short(version) and complete and not force:
        host.noop(f"cuDNN {found} is unpacked in {tree}")
        return
    if found is not None and not complete and not force:
        host.log(f"{tree} has no completion marker (an interrupted extract?): unpacking again")
    partial, name = f"{tree}.partial", posixpath.basename(tree)
    q_tree, q_partial = QuoteString(tree), QuoteString(partial)
    yield StringCommand(
        "rm -rf", q_partial, "&& mkdir -p", q_partial, "&& tar -xf", QuoteString(archive),
        "-C", q_partial, "&& test -d", QuoteString(f"{partial}/{name}"),
        "&& rm -rf", q_tree, "&& mv", QuoteString(f"{partial}/{name}"), q_tree,
        "&& rmdir", q_partial, "&& sha256sum", QuoteString(archive),
        "| cut -d' ' -f1 >", QuoteString(cudnn_marker_path(tree) + ".tmp"),
        "&& mv -f", QuoteString(cudnn_marker_path(tree) + ".tmp"),
        QuoteString(cudnn_marker_path(tree)),
    )  # fmt: skip


@operation()
def link(src_dir: str, cuda_dir: str):
    """
    Hard-link (``cp -lP``) the unpacked cuDNN headers and libraries into ``cuda_dir``.

    Same inode already there: nothing. Another file there (another version's, or a copy):
    removed, then linked. cuDNN files in ``cuda_dir`` the tree does not have (another version's
    ``libcudnn*.so.8.x.y``): removed. ``ldconfig`` after any change.

    + src_dir: the unpacked tree (``extracted_dir(...)``)
    + cuda_dir: the CUDA toolkit dir
    """
    state = ask(host, CudnnFiles, src_dir=src_dir, cuda_dir=cuda_dir)
    src, dst = state["src"], state["dst"]
    if not src:
        yield from refuse._inner(
            step="cuDNN hard links",
            reason=f"no include/cudnn*.h or lib/libcudnn* under {src_dir}",
            remedy="check the cuDNN archive (stack.cudnn) and re-run",
        )
        return

    wanted = {}
    for rel, info in src.items():
        top, name = rel.split("/", 1)
        wanted[f"{_DEST_DIRS[top]}/{name}"] = (rel, info)

    remove: list[str] = []
    to_link: dict[str, list[str]] = {}
    for dest_rel, (src_rel, info) in sorted(wanted.items()):
        have = dst.get(dest_rel)
        if have is not None and (have.device, have.inode) == (info.device, info.inode):
            continue
        if have is not None:
            remove.append(dest_rel)
        to_link.setdefault(posixpath.dirname(dest_rel), []).append(src_rel)
    stale = sorted(rel for rel in dst if rel not in wanted)
    remove += stale

    if not remove and not to_link:
        host.noop(f"cuDNN files in {cuda_dir} are hard links to {src_dir}")
        return
    if stale:
        host.log(f"removing cuDNN files of another version from {cuda_dir}: {', '.join(stale)}")
    if remove:
        yield StringCommand(
            "rm -f", *(QuoteString(posixpath.join(cuda_dir, rel)) for rel in sorted(remove))
        )
    for dest_sub, src_rels in sorted(to_link.items()):
        target = posixpath.join(cuda_dir, dest_sub)
        yield StringCommand(
            "mkdir -p",
            QuoteString(target),
            "&& cp -lP",
            *(QuoteString(posixpath.join(src_dir, rel)) for rel in sorted(src_rels)),
            QuoteString(target + "/"),
        )
    yield "ldconfig"


@operation()
def verify(cuda_dir: str, version: str):
    """
    Fail the host unless ``<cuda_dir>/include/cudnn_version.h`` says ``version``.

    + cuda_dir: the CUDA toolkit dir
    + version: the pinned version, e.g. ``8.9.7.29`` (checked as 8.9.7)
    """
    header = f"{cuda_dir.rstrip('/')}/include/cudnn_version.h"
    found = ask(host, CudnnHeaderVersion, path=header)
    if found == _short(version):
        host.noop(f"cuDNN {found} in {cuda_dir}")
        return
    yield from refuse._inner(
        step=f"cuDNN {version}",
        reason=f"{header} says {found or 'nothing'}, expected {_short(version)}",
        remedy="put 'cudnn' in stack.policy.force_reinstall and re-run",
    )


def survey_parts(spec: StackSpec) -> list[Part]:
    """The facts this module's operations ask on a converged host (``operations.run.survey``)."""
    paths = spec.paths
    tree = extracted_dir(paths.cudnn_extract_dir, artifact_path(spec, "cudnn"))
    return [
        part(PathDevice, path=paths.cudnn_extract_dir),  # same_filesystem
        part(PathDevice, path=paths.cuda_dir),
        part(UnsafeParent, path=paths.cudnn_extract_dir),  # extract
        part(CudnnHeaderVersion, path=f"{tree}/include/cudnn_version.h"),
        part(CudnnExtracted, tree=tree),
        part(CudnnFiles, src_dir=tree, cuda_dir=paths.cuda_dir),  # link
        part(CudnnHeaderVersion, path=f"{paths.cuda_dir.rstrip('/')}/include/cudnn_version.h"),
    ]
