"""The verl checks: its version, its checkout and the patch rules applied to it."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from p40fleet.verification.check import FAIL, PASS, SKIP, Check, force_reinstall, no_answer
from p40fleet.verification.checks._common import PYTHON, py_failure, python_missing
from p40fleet.verification.probe import CheckContext


def _same_version(found: str | None, pinned: str) -> bool:
    if found is None:
        return False
    if found == pinned:
        return True
    try:
        return Version(found) == Version(pinned)
    except InvalidVersion:
        return False


def verl_version(ctx: CheckContext) -> Check:
    name = "verl version"
    pinned = ctx.spec.verl.version
    remedy = force_reinstall("verl", PYTHON)
    section = ctx.answers.section("verl")
    if section is None:
        return no_answer(name, "import verl", remedy)
    if missing := python_missing(section):
        return Check(name, FAIL, missing, PYTHON)
    answer = section.answer
    if answer is None:
        return Check(name, FAIL, py_failure(section, "import verl"), remedy)
    if answer.get("error"):
        return Check(name, FAIL, f"import verl failed: {answer['error']}", remedy)
    found = answer.get("version")
    if _same_version(found, pinned):
        return Check(name, PASS, f"verl {found} ({answer.get('file')})")
    return Check(name, FAIL, f"verl.__version__ is {found}, expected {pinned}", remedy)


def verl_checkout(ctx: CheckContext) -> Check:
    name = "verl checkout"
    pin = ctx.spec.verl
    remedy = PYTHON + f" (checks out {pin.ref} = {pin.commit[:12]})"
    section = ctx.answers.section("verl-git")
    if section is None:
        return no_answer(name, "the verl checkout", remedy)
    missing = section.get("missing")
    if missing:
        what = "git is not installed" if missing == "git" else f"no verl checkout at {missing}"
        return Check(name, FAIL, what, remedy)
    head = section.get("head") or ""
    ref = section.get("ref") or ""
    if not head:
        return Check(name, FAIL, "the verl checkout is not a git repository", remedy)
    if head != pin.commit:
        return Check(
            name,
            FAIL,
            f"HEAD is {head[:12]}, the spec pins {pin.ref} = {pin.commit[:12]}",
            remedy,
        )
    if ref and ref != pin.commit:
        return Check(
            name,
            FAIL,
            f"HEAD is the pinned commit but {pin.ref} resolves to {ref[:12]} in the checkout",
            "fix stack.verl.ref/commit (they must name the same commit) or the moved tag",
        )
    note = "" if ref else f" ({pin.ref} is not a ref in the checkout)"
    return Check(name, PASS, f"at {pin.ref} = {pin.commit[:12]}{note}")


def verl_patches(ctx: CheckContext) -> Check:
    from p40fleet import verl_patches

    name = "verl patches"
    pin = ctx.spec.verl
    remedy = f"{PYTHON} (applies the patch rules for the host's GPU profile)"
    if ctx.profile is None:
        return Check(name, SKIP, "no GPU profile (see gpus)")
    try:
        rules = verl_patches.rule_set(pin.ref, ctx.profile)
    except verl_patches.VerlPatchError as exc:
        return Check(
            name,
            FAIL,
            str(exc),
            "pin a verl ref that has a rule set for this profile (p40fleet/verl_patches.py)",
        )
    expected_ids = [r.id for r in rules.rules]
    section = ctx.answers.section("verl-patches")
    if section is None:
        return no_answer(name, "the verl patch record", remedy)
    git = ctx.answers.section("verl-git")
    modified = set(git.values("modified")) if git else set()
    record_missing = section.get("missing")
    answer = section.answer
    if record_missing:
        if expected_ids:
            return Check(
                name,
                FAIL,
                f"no patch record {record_missing}: the {len(expected_ids)} {ctx.profile} "
                f"rules for {pin.ref} are not applied",
                remedy,
            )
        if modified:
            return Check(
                name,
                FAIL,
                f"local edits in the verl checkout: {', '.join(sorted(modified))}",
                "save them elsewhere, restore with `git checkout -- <files>` and "
                + PYTHON.removeprefix("run "),
            )
        return Check(name, PASS, f"no patch rules for {ctx.profile} at {pin.ref}; none recorded")
    if answer is None or answer.get("error"):
        why = (answer or {}).get("error") or py_failure(section, "reading the record")
        return Check(name, FAIL, f"unreadable patch record: {why}", remedy)
    recorded_ids = list(answer.get("rule_ids") or [])
    if (answer.get("ref"), answer.get("profile")) != (pin.ref, ctx.profile) or (
        recorded_ids != expected_ids
    ):
        return Check(
            name,
            FAIL,
            f"recorded: {len(recorded_ids)} rules for {answer.get('ref')}/"
            f"{answer.get('profile')}; expected: {len(expected_ids)} rules for "
            f"{pin.ref}/{ctx.profile}",
            remedy,
        )
    files: dict[str, str] = answer.get("files") or {}
    found: dict[str, str | None] = answer.get("found") or {}
    drifted = sorted(rel for rel, sha in files.items() if found.get(rel) != sha)
    edits = sorted(modified - set(files))
    if drifted or edits:
        return Check(
            name,
            FAIL,
            "local edits in the verl checkout: " + ", ".join(drifted + edits),
            "save them elsewhere, restore with `git checkout -- <files>` and "
            + PYTHON.removeprefix("run "),
        )
    if not expected_ids:
        return Check(name, PASS, f"no patch rules for {ctx.profile} at {pin.ref}")
    return Check(
        name,
        PASS,
        f"{len(expected_ids)} {ctx.profile} rules for {pin.ref} applied, "
        f"{len(files)} patched files intact",
    )
