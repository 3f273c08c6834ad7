"""The cuDNN checks: the header's version and the hard links into the CUDA dir."""

from __future__ import annotations

import re
from dataclasses import dataclass

from p40fleet.verification.check import FAIL, PASS, Check, force_reinstall, no_answer
from p40fleet.verification.checks._common import SYSTEM
from p40fleet.verification.probe import CheckContext, Section


def cudnn_version(ctx: CheckContext) -> Check:
    name = "cudnn version"
    expected = ".".join(ctx.spec.cudnn.version.split(".")[:3])
    section = ctx.answers.section("cudnn-header")
    remedy = force_reinstall("cudnn", SYSTEM)
    if section is None:
        return no_answer(name, "cudnn_version.h", remedy)
    missing = section.get("missing")
    if missing:
        return Check(name, FAIL, f"no {missing}", f"{SYSTEM} (installs cuDNN {expected})")
    parts: dict[str, str] = {}
    for line in section.raw:
        if match := re.match(r"#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", line.strip()):
            parts[match.group(1)] = match.group(2)
    if len(parts) != 3:
        return Check(name, FAIL, "cudnn_version.h has no CUDNN_MAJOR/MINOR/PATCHLEVEL", remedy)
    found = f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCHLEVEL']}"
    if found == expected:
        return Check(name, PASS, f"cudnn_version.h: {found}")
    return Check(name, FAIL, f"cudnn_version.h says {found}, expected {expected}", remedy)


@dataclass(frozen=True)
class _Stat:
    device: str
    inode: str
    links: int
    kind: str


def _cudnn_files(section: Section) -> tuple[dict[str, _Stat], dict[str, _Stat]]:
    src: dict[str, _Stat] = {}
    dst: dict[str, _Stat] = {}
    for line in section.raw:
        words = line.split(None, 5)
        if len(words) != 6 or words[0] not in ("src", "dst") or not words[3].isdigit():
            continue
        stat = _Stat(words[1], words[2], int(words[3]), words[4])
        (src if words[0] == "src" else dst)[words[5]] = stat
    return src, dst


_CUDNN_DEST_DIRS = {"include": "include", "lib": "lib64"}


def cudnn_links(ctx: CheckContext) -> Check:
    name = "cudnn hard links"
    remedy = f"{SYSTEM} (hard-links the extracted cuDNN files into the CUDA dir)"
    section = ctx.answers.section("cudnn-files")
    if section is None:
        return no_answer(name, "the cuDNN files", remedy)
    tree = section.get("tree") or ctx.spec.paths.cudnn_extract_dir
    cuda_dir = section.get("cuda_dir") or ctx.spec.paths.cuda_dir
    src, dst = _cudnn_files(section)
    if not src:
        return Check(
            name,
            FAIL,
            f"no include/cudnn*.h or lib/libcudnn* under {tree} (the extract dir)",
            force_reinstall("cudnn", SYSTEM),
        )
    wanted = {}
    for rel, stat in src.items():
        top, _, rest = rel.partition("/")
        wanted[f"{_CUDNN_DEST_DIRS.get(top, top)}/{rest}"] = stat
    missing = sorted(rel for rel in wanted if rel not in dst)
    copies = sorted(
        rel
        for rel, stat in wanted.items()
        if rel in dst
        and ((dst[rel].device, dst[rel].inode) != (stat.device, stat.inode) or dst[rel].links < 2)
    )
    stale = sorted(rel for rel in dst if rel not in wanted)
    if not (missing or copies or stale):
        return Check(
            name,
            PASS,
            f"{len(wanted)} files in {cuda_dir} are hard links of {tree} (same inode, "
            f"{min(s.links for s in wanted.values())}+ links)",
        )
    parts = []
    if copies:
        parts.append("not hard links (another inode): " + ", ".join(copies))
    if missing:
        parts.append("missing: " + ", ".join(missing))
    if stale:
        parts.append("not from the extract dir (another version?): " + ", ".join(stale))
    return Check(name, FAIL, f"cuDNN files in {cuda_dir} vs {tree}: " + "; ".join(parts), remedy)
