"""verl: pinned checkout, capability patches, pinned deps, editable install with ``--no-deps``.

``--no-deps`` because verl's install_requires (and extras: vllm, sglang, flash-attn) pull other
torch builds; the pinned import-time deps come from ``files/verl-requirements-<variant>.txt``.
Changing the verl ref re-runs these steps only (apex and torch keys do not include verl).
"""

from __future__ import annotations

import hashlib
import posixpath

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import Directory
from pyinfra.operations import files

from p40fleet import verl_patches
from p40fleet.facts.env import EnvDistributions, MarkerText, env_python
from p40fleet.facts.env import env_dir as conda_env_dir
from p40fleet.facts.home import UserFile
from p40fleet.facts.survey import Part, ask, part
from p40fleet.facts.verl import GitCheckout, VerlPatchCheck
from p40fleet.operations.refuse import refuse, refuse_option_ref
from p40fleet.operations.torch import pip_command, same_version
from p40fleet.operations.util.as_user import as_user, mkdir_as, put_as, write_as
from p40fleet.operations.util.unchanged import same_file, same_user_file
from p40fleet.proxy import proxied
from p40fleet.spec import Proxy, StackSpec
from p40fleet.verl_patches import APPLIER_PATH

__all__ = [
    "PATCH_EXIT",
    "REQUIREMENTS_MARKER",
    "checkout",
    "checkout_moves",
    "install",
    "patch",
    "requirements",
    "survey_parts",
]

#: Exit codes of files/verl_patches.py.
PATCH_EXIT = {"changed": 0, "no-change": 100, "mismatch": 2, "local-edits": 3, "unsupported": 4}
#: In the env dir: sha256 of the requirements file last installed there.
REQUIREMENTS_MARKER = ".p40fleet-verl-requirements.sha256"


def checkout_moves(path: str, commit: str, user: str | None) -> bool:
    """This host's verl checkout is not at ``commit`` yet (so patch + install must re-run)."""
    return ask(host, GitCheckout, path=path, user=user).head != commit


@operation()
def checkout(
    path: str,
    remote: str,
    ref: str,
    commit: str,
    user: str | None = None,
    proxy: Proxy | None = None,
):
    """
    Clone ``remote`` into ``path`` and check out ``ref``, which must resolve to ``commit``.

    + path: checkout directory (the editable install points here)
    + remote: git remote (``spec.git_remote("verl")``)
    + ref: tag/branch to check out
    + commit: the commit HEAD must be at
    + user: run the commands as this user (``su``); None = as connected
    + proxy: ``stack.proxy`` for the fetch (None: no proxy)

    At another commit: fetch, then check out the new ref, dropping only our own recorded
    patches; local edits and untracked files in the new commit's way stop the host with their
    file names, never clobbered (and the checkout runs without -f).
    """
    if ref.startswith("-"):
        yield from refuse_option_ref("verl checkout", ref, "stack.verl.ref", "v0.5.0")
        return
    state = ask(host, GitCheckout, path=path, user=user)
    q_path = QuoteString(path)
    if state.exists and not state.is_repo:
        yield from refuse._inner(
            step="verl checkout",
            reason=f"{path} exists but is not a git checkout",
            remedy=f"move {path} away (or set stack.env.verl_checkout elsewhere) and re-run",
        )
        return
    if state.is_repo and state.head == commit:
        if state.origin and state.origin != remote:
            yield as_user(
                user, StringCommand("git -C", q_path, "remote set-url origin", QuoteString(remote))
            )
        else:
            host.noop(f"verl checkout at {ref} ({commit[:12]})")
        return
    if not state.exists:
        clone = StringCommand("git clone --quiet", QuoteString(remote), q_path)
        yield proxied(as_user(user, clone), proxy)
    else:
        host.log(f"verl checkout at {(state.head or '?')[:12]}, moving to {ref} ({commit[:12]})")
        if state.origin != remote:
            yield as_user(
                user, StringCommand("git -C", q_path, "remote set-url origin", QuoteString(remote))
            )
        fetch = StringCommand("git -C", q_path, "fetch --quiet --tags --force origin")
        yield proxied(as_user(user, fetch), proxy)
        # Only our recorded patches may differ from HEAD (files/verl_patches.py --guard, which owns
        # the record): the user's edits and untracked files in the new commit's way stop the host
        # naming the files; our patches are restored, so the checkout below needs no -f. The
        # applier is not uploaded yet (the patch step does that): its text runs as the program.
        yield as_user(
            user,
            StringCommand(
                "python3 -c",
                QuoteString(APPLIER_PATH.read_text()),
                "--checkout",
                q_path,
                "--guard",
                QuoteString(f"{ref}^{{commit}}"),
            ),
        )
    # No -f: the guard restored our own patches; anything else in the way makes git refuse.
    yield as_user(
        user,
        StringCommand(
            "git -C",
            q_path,
            "-c advice.detachedHead=false checkout --quiet",
            QuoteString(f"{ref}^{{commit}}"),
            "|| { echo",
            QuoteString(
                f"verl checkout {path}: git refused to move to {ref} (files of yours in the "
                "way, named above); move them elsewhere and re-run"
            ),
            ">&2; exit 1; }",
        ),
    )
    yield as_user(
        user,
        StringCommand(
            "head=$(git -C",
            q_path,
            'rev-parse HEAD) && [ "$head" =',
            QuoteString(commit),
            "] || { echo",
            QuoteString(f"verl: {ref} is at"),
            '"$head"',
            QuoteString(f"but the spec pins {commit}: fix stack.verl.ref/commit"),
            ">&2; exit 1; }",
        ),
    )


#: The applier's name on hosts: files/verl_patches.py keeps the name converged hosts hold, so a
#: converged host sees no new upload.
HOST_APPLIER = "verl_patch.py"


def patch_files(work_dir: str, rules_json: str) -> tuple[str, str]:
    """The applier's and the rule set's paths on the host (the rule set named by its sum)."""
    digest = hashlib.sha256(rules_json.encode()).hexdigest()[:16]
    return posixpath.join(work_dir, HOST_APPLIER), posixpath.join(work_dir, f"rules-{digest}.json")


@operation()
def patch(
    python: str,
    checkout: str,
    script_src: str,
    rules_json: str,
    work_dir: str,
    user: str,
    checkout_changes: bool = False,
):
    """
    Apply the profile's verl patch rules with ``files/verl_patches.py`` on the host.

    + python: interpreter that runs the applier (stdlib only)
    + checkout: the verl checkout
    + script_src: local path of ``files/verl_patches.py``
    + rules_json: the rule set (``p40fleet.verl_patches``), as JSON text
    + work_dir: where the applier and rules are uploaded
    + user: owner of the uploaded files
    + checkout_changes: the checkout moves to another commit earlier in this run

    Exit 3 (local edits: a patched file differs from what the applier recorded) fails the host
    with the applier's message naming the files; nothing is overwritten.
    """
    script, rules = patch_files(work_dir, rules_json)
    yield from mkdir_as(user, work_dir)  # as the user: no root-owned directory in its home
    with open(script_src, "rb") as handle:
        applier = handle.read()
    # written by the user (N1): root stages them outside the home
    if not same_user_file(script, applier, user, "755"):
        yield from put_as(user, applier, script, "755")
    if not same_user_file(rules, rules_json.encode(), user, "644"):
        yield from put_as(user, rules_json.encode(), rules, "644")
    check = ask(
        host,
        VerlPatchCheck,
        python=python,
        script=script,
        rules=rules,
        checkout=checkout,
        user=user,
    )
    if check == str(PATCH_EXIT["no-change"]) and not checkout_changes:
        host.noop("verl patch rules already applied")
        return
    yield as_user(
        user,
        StringCommand(
            QuoteString(python),
            QuoteString(script),
            "--rules",
            QuoteString(rules),
            "--checkout",
            QuoteString(checkout),
            "; rc=$?; case $rc in 0|100) exit 0;; 3) echo",
            QuoteString(
                f"verl checkout {checkout} has local edits in patched files (named above): "
                "not overwriting them; save them elsewhere, restore the files with "
                "'git checkout -- <files>' and re-run"
            ),
            ">&2;; esac; exit $rc",
        ),
    )


@operation()
def requirements(
    python: str,
    src: str,
    dest: str,
    env_dir: str,
    index_args: list[str] | None = None,
    fresh_env: bool = False,
    user: str | None = None,
    proxy: Proxy | None = None,
):
    """
    ``pip install --require-hashes -r`` verl's locked deps; skip when this file's sum is recorded.

    + python: the env's interpreter
    + src: local requirements file (``files/verl-requirements-<variant>.txt``)
    + dest: where it is uploaded on the host
    + env_dir: env dir (holds the recorded sha256)
    + index_args: pip index arguments (``spec.pip_index_args()``)
    + fresh_env: the env is (re)created earlier in this run
    + user: run the commands as this user (``su``); None = as connected
    + proxy: ``stack.proxy`` for the fetch (None: no proxy)
    """
    with open(src, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    with open(src, "rb") as handle:
        text = handle.read()
    if user:  # written by the user (N1): no root-owned directory or file, no root write there
        yield from mkdir_as(user, posixpath.dirname(dest))
        if not same_user_file(dest, text, user, "644"):
            yield from put_as(user, text, dest, "644")
    elif not same_file(dest, text):
        yield from files.put._inner(src=src, dest=dest, add_deploy_dir=False)
    marker = f"{env_dir.rstrip('/')}/{REQUIREMENTS_MARKER}"
    if not fresh_env and ask(host, MarkerText, path=marker, user=user) == digest:
        host.noop(f"verl requirements {posixpath.basename(src)} already installed")
        return
    yield proxied(as_user(
        user,
        pip_command(
            python,
            # Every line carries its sha256; an sdist (antlr4) is built against the env's hashed
            # setuptools, as an isolated build would fetch its backend without any hash check.
            "install --require-hashes --no-build-isolation --use-pep517",
            *(QuoteString(arg) for arg in index_args or []),
            "-r",
            QuoteString(dest),
        ),
    ), proxy)  # fmt: skip
    yield write_as(user, marker, digest)


@operation()
def install(
    python: str,
    checkout: str,
    version: str,
    fresh_env: bool = False,
    checkout_changes: bool = False,
    force: bool = False,
    user: str | None = None,
):
    """
    ``pip install --no-deps -e CHECKOUT``; no-op when verl ``version`` is installed from there.

    + python: the env's interpreter
    + checkout: the verl checkout
    + version: verl's version at the pinned ref (spec.verl.version)
    + fresh_env: the env is (re)created earlier in this run
    + checkout_changes: the checkout moves to another commit earlier in this run
    + force: reinstall anyway
    + user: run the commands as this user (``su``); None = as connected
    """
    dists = {} if fresh_env else ask(host, EnvDistributions, python=python, user=user)
    verl = dists.get("verl")
    here = verl is not None and (verl.editable or "").rstrip("/") == checkout.rstrip("/")
    if here and same_version(verl.version, version) and not (checkout_changes or force):
        host.noop(f"verl {version} installed (editable) from {checkout}")
        return
    if verl is not None and not here:
        host.log(f"verl {verl.version} installed from {verl.editable or 'a wheel'}: replacing")
    yield as_user(
        user,
        pip_command(
            python,
            # --no-index: nothing is downloaded here (the checkout is pinned by commit).
            "install --no-deps --no-build-isolation --no-index -e",
            QuoteString(checkout),
        ),
    )
    yield as_user(
        user,
        StringCommand(
            QuoteString(python),
            "-c",
            QuoteString(
                "import importlib.metadata as m, sys; v = m.version('verl'); "
                f"sys.exit(0 if v == {version!r} else 'verl %s installed, expected {version}' % v)"
            ),
        ),
    )


def survey_parts(spec: StackSpec) -> list[Part]:
    """The facts this module asks on a converged host, with deploy/python.py's paths, for every
    GPU profile's rule set (the host's GPUs are not known before the survey answers;
    ``operations.run.survey``)."""
    user, env = spec.user, spec.env
    by_user = {"user": user.name}
    python = env_python(env.conda_prefix, env.name)
    the_env = conda_env_dir(env.conda_prefix, env.name)
    cache = f"{user.home}/.cache/p40fleet"
    work_dir = f"{cache}/verl-patch"
    script = posixpath.join(work_dir, HOST_APPLIER)
    parts = [
        part(GitCheckout, path=env.verl_checkout, **by_user),  # checkout, checkout_moves
        part(Directory, path=work_dir),  # patch (mkdir_as)
        part(UserFile, path=script, **by_user),
    ]
    for profile in verl_patches.PROFILES:
        try:
            rules_json = verl_patches.ruleset_json(spec.verl.ref, profile)
        except verl_patches.VerlPatchError:
            continue  # no rules for this profile: the host is refused before the patch
        _, rules = patch_files(work_dir, rules_json)
        parts.append(part(UserFile, path=rules, **by_user))
        parts.append(
            part(VerlPatchCheck, python=python, script=script, rules=rules,
                 checkout=env.verl_checkout, **by_user)
        )  # fmt: skip
    dest = f"{cache}/verl-requirements-{spec.requirements_variant}.txt"
    return parts + [
        part(Directory, path=cache),  # requirements (mkdir_as)
        part(UserFile, path=dest, **by_user),
        part(MarkerText, path=f"{the_env.rstrip('/')}/{REQUIREMENTS_MARKER}", **by_user),
        part(EnvDistributions, python=python, **by_user),  # install
    ]
