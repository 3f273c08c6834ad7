"""Apex: built once per fleet and build key, then installed from the wheel on every host.

The build key and its arithmetic are ``p40fleet/apex_build.py``. Per key and pyinfra run,
exactly one host builds (``operations/apex_fleet.builder``: the first host of the inventory
that needs that key):

    builder:  build_wheel -> fetch_wheel (files.get to the controller cache)
    others:   put_wheel (files.put from the controller cache)
    all:      put_sum, install (check the wheel's sha256, pip install --no-deps it; record the key)

pyinfra runs each operation on every host before the next one starts, so the builder's build
and fetch finish before any host's put. A wheel already in the controller cache whose sha256
matches the sum recorded next to it (``apex-wheel.tar.sha256``) means no build at all; to force
a rebuild, delete ``<controller cache>/apex/<key>/``.

Integrity (the builder's cache dir is writable by its training user, and a copy can be cut
short): the builder always builds afresh (a tar found there from before is never trusted) and
writes the tar's sha256 in the same command. The controller fetches both under temporary names,
checks the tar against that sum and only then records the sum and renames the tar into place.
The controller's copy is checked against its recorded sum when the run is planned (a mismatch
means "not built": this run rebuilds it) and again before each upload; each host checks its
tar against the controller's sum (uploaded root-owned) right before ``pip install``.

Build flags (stack facts §4): ``--no-build-isolation`` (the build imports torch),
``--config-settings "--build-option=--cpp_ext"`` and, when the torch pin is a CUDA build,
``"--build-option=--cuda_ext"`` with ``CUDA_HOME`` = the pinned toolkit (apex stops when nvcc and
``torch.version.cuda`` differ).
"""

from __future__ import annotations

import os
import posixpath

from pyinfra import host
from pyinfra.api import FunctionCommand, Host, QuoteString, StringCommand, operation
from pyinfra.facts.files import File
from pyinfra.operations import files

from facts.conda import EnvDistributions, MarkerText
from facts.survey import ask
from operations.progress import Stopwatch
from operations.refuse import refuse_option_ref
from operations.torch import pip_command
from operations.training_user import as_user, mkdir_as, put_as
from p40fleet.apex_build import (
    KEY_FILE,
    WHEEL_TAR,
    complete_wheel_tar,
    controller_wheel_ok,
    recorded_sum,
    sha256_of,
)
from p40fleet.privdrop import READ_TIMEOUT_S, STAGE_DIR
from p40fleet.proxy import proxied
from p40fleet.spec import Proxy, spec_for_host

__all__ = [
    "build_wheel",
    "fetch_wheel",
    "install",
    "needed",
    "put_sum",
    "put_wheel",
]


def needed(
    python: str,
    env_dir: str,
    key: str,
    user: str | None,
    fresh_env: bool = False,
    force: bool = False,
    target: Host | None = None,
) -> bool:
    """Whether ``target`` (default: this host) must install apex at ``key`` in this run.

    + python, env_dir, key, user, fresh_env, force: as :func:`install` takes them
    + target: another inventory host, for the builder election (its own facts)
    """
    if fresh_env or force:
        return True
    on = host if target is None else target
    if ask(on, MarkerText, path=f"{env_dir.rstrip('/')}/{KEY_FILE}", user=user) != key:
        return True
    return "apex" not in ask(on, EnvDistributions, python=python, user=user)


@operation()
def build_wheel(
    python: str,
    remote: str,
    ref: str,
    commit: str,
    work_dir: str,
    cuda_home: str,
    arch_list: str,
    max_jobs: int,
    cuda_ext: bool,
    user: str | None = None,
    needed: bool = True,
    proxy: Proxy | None = None,
):
    """
    Clone apex at ``ref`` (verified = ``commit``) and build one wheel into ``WORK/apex-wheel.tar``.

    + python: the env's interpreter (its torch is the build's torch)
    + remote: git remote of apex
    + ref: tag or branch to check out
    + commit: the commit ``ref`` must resolve to
    + work_dir: per-key dir (``src/``, ``wheels/``, ``build.log``, the tar)
    + cuda_home: CUDA toolkit for ``--cuda_ext`` (must match torch.version.cuda)
    + arch_list: TORCH_CUDA_ARCH_LIST, only the arches present
    + max_jobs: MAX_JOBS for the compiler (``p40fleet.apex_build.max_jobs``)
    + cuda_ext: build the CUDA extensions too
    + user: run the commands as this user (``su``); None = as connected
    + proxy: ``stack.proxy`` for the fetch (None: no proxy)
    + needed: False when this host is not the build key's builder in this run (no-op)
    """
    if not needed:
        host.noop("apex wheel: built by another host or already on the controller")
        return
    if ref.startswith("-"):
        yield from refuse_option_ref("apex build", ref, "stack.apex.ref", "25.09")
        return
    tar = f"{work_dir}/{WHEEL_TAR}"
    src, wheels, log = f"{work_dir}/src", f"{work_dir}/wheels", f"{work_dir}/build.log"
    # A tar already here has no sum from this run (its dir is the training user's): rebuilt.
    if ask(host, File, path=tar):
        host.log(f"apex wheel {tar} from an earlier build is not trusted: building afresh")
    host.log(f"apex build (minutes; compiles C++/CUDA): log on this host at {log}")
    q_src = QuoteString(src)
    yield as_user(
        user,
        StringCommand(
            "rm -rf",
            q_src,
            QuoteString(wheels),
            QuoteString(tar),
            QuoteString(f"{tar}.sha256"),
            "&& mkdir -p",
            QuoteString(wheels),
        ),
    )
    clone = StringCommand("git clone --quiet", QuoteString(remote), q_src)
    yield proxied(as_user(user, clone), proxy)
    yield as_user(
        user,
        StringCommand(
            "git -C", q_src, "-c advice.detachedHead=false checkout --quiet", QuoteString(ref)
        ),
    )
    yield as_user(
        user,
        StringCommand(
            "head=$(git -C",
            q_src,
            'rev-parse HEAD) && [ "$head" =',
            QuoteString(commit),
            "] || { echo",
            QuoteString(f"apex: {ref} is at"),
            '"$head"',
            QuoteString(f"but the spec pins {commit}: fix stack.apex.ref/commit"),
            ">&2; exit 1; }",
        ),
    )
    build_options = ["--cpp_ext"] + (["--cuda_ext"] if cuda_ext else [])
    settings: list[str | QuoteString] = []
    for option in build_options:
        settings += ["--config-settings", QuoteString(f"--build-option={option}")]
    watch = Stopwatch("apex build", log=log)
    yield watch.start()
    yield as_user(
        user,
        StringCommand(
            "start=$(date +%s) && cd",
            q_src,
            "&& env",
            QuoteString(f"CUDA_HOME={cuda_home}"),
            QuoteString(f"TORCH_CUDA_ARCH_LIST={arch_list}"),
            QuoteString(f"MAX_JOBS={max_jobs}"),
            pip_command(
                python,
                "wheel -v --no-cache-dir --no-build-isolation --no-deps -w",
                QuoteString(wheels),
                *settings,
                "./",
            ),
            ">",
            QuoteString(log),
            "2>&1 || { tail -n 40",
            QuoteString(log),
            "; echo",
            QuoteString("apex build failed after"),
            '"$(( $(date +%s) - start ))s, full log:"',
            QuoteString(log),
            ">&2; exit 1; }; echo",
            QuoteString("apex build took"),
            '"$(( $(date +%s) - start ))s, log:"',
            QuoteString(log),
            "| tee -a",
            QuoteString(log),
        ),
    )
    yield watch.stop()
    yield as_user(
        user,
        StringCommand(
            "cd",
            QuoteString(wheels),
            "&& tar -cf",
            QuoteString(f"{tar}.part"),
            "apex-*.whl && sha256sum",
            QuoteString(f"{tar}.part"),
            "| cut -c1-64 >",
            QuoteString(f"{tar}.sha256.part"),
            "&& mv",
            QuoteString(f"{tar}.part"),
            QuoteString(tar),
            "&& mv",
            QuoteString(f"{tar}.sha256.part"),
            QuoteString(f"{tar}.sha256"),
        ),
    )


@operation()
def fetch_wheel(remote_tar: str, local_tar: str, needed: bool = True, user: str | None = None):
    """
    Copy the builder's wheel tar and its sum to the controller cache; record the sum.

    + remote_tar: the tar on the builder (``remote_tar.sha256``: its sum, written by the build)
    + local_tar: where the controller keeps it (one dir per build key)
    + needed: False on hosts that did not build it (no-op)
    + user: the training user, who reads both (default: the host's spec's ``user.name``)

    Root never reads the user's files (a link there would hand the controller any file of
    root's): the user's ``cat`` streams each into root's 0700 stage dir, fetched from there.

    Both land under temporary names; ``local_tar.sha256`` is written (temp name, then rename)
    and the tar renamed into place only after the copy matches the builder's sum and is a
    complete wheel tar, so an interrupted copy is never taken for the wheel.
    """
    if not needed:
        host.noop("apex wheel: not built here")
        return
    if user is None:
        user = spec_for_host(host).user.name
    part, part_sum = f"{local_tar}.part", f"{local_tar}.part.sha256"
    staged = posixpath.join(STAGE_DIR, f"fetch-{posixpath.basename(posixpath.dirname(remote_tar))}")
    yield StringCommand("install -d -m 700", QuoteString(STAGE_DIR))
    for src, dest, name in (
        (remote_tar, part, f"{staged}.tar"),
        (f"{remote_tar}.sha256", part_sum, f"{staged}.sha256"),
    ):
        read = StringCommand("timeout", str(READ_TIMEOUT_S), "cat --", QuoteString(src))
        yield StringCommand(as_user(user, read), "</dev/null >", QuoteString(name))
        yield from files.get._inner(
            src=name, dest=dest, add_deploy_dir=False, create_local_dir=True, force=True
        )
    yield StringCommand("rm -f", QuoteString(f"{staged}.tar"), QuoteString(f"{staged}.sha256"))

    def _record(state, host) -> bool:  # noqa: ARG001 - pyinfra passes (state, host)
        want, got = recorded_sum(part_sum), sha256_of(part) if os.path.isfile(part) else None
        problem = None
        if want is None or got != want:
            problem = f"copy has sha256 {got}, the build wrote {want} (cut short or swapped)"
        else:
            problem = complete_wheel_tar(part)
        if problem:
            host.log_styled(
                f"host {host.name}: apex wheel fetch: {remote_tar}: {problem} — fix: re-run "
                "(the builder builds it again; nothing was recorded on the controller)",
                fg="red",
            )
            return False
        with open(f"{local_tar}.sha256.tmp", "w") as handle:
            handle.write(f"{got}  {WHEEL_TAR}\n")
        os.replace(part, local_tar)
        os.replace(f"{local_tar}.sha256.tmp", f"{local_tar}.sha256")
        os.unlink(part_sum)
        return True

    yield FunctionCommand(_record, (), {})


@operation()
def put_wheel(
    local_tar: str, remote_tar: str, user: str, builder: str | None = None, needed: bool = True
):
    """
    Upload the wheel tar from the controller cache (built earlier in this run or before).

    + local_tar: the controller's copy
    + remote_tar: destination on this host
    + user: owner of the uploaded file (the training user)
    + builder: the host building it in this run, for the error message
    + needed: False on the builder and on hosts whose apex is current (no-op)
    """
    if not needed:
        host.noop("apex wheel: already here")
        return
    where = f"host {builder} was to build it in this run" if builder else "none was built"

    def _refuse(state, host) -> bool:  # noqa: ARG001 - pyinfra passes (state, host)
        ok, why = controller_wheel_ok(local_tar)  # again now: the builder may just have made it
        if ok:
            return True
        host.log_styled(
            f"host {host.name}: apex wheel upload: {why} ({where}) — fix: fix that host's "
            f"build, or delete {os.path.dirname(local_tar)}/ to rebuild it, then re-run",
            fg="red",
        )
        return False

    # Checked when the upload runs, whether or not the copy looked right while planning.
    yield FunctionCommand(_refuse, (), {})
    yield from mkdir_as(user, remote_tar.rsplit("/", 1)[0])  # S12: as the user, not root
    yield from put_as(user, local_tar, remote_tar, "644")  # N1: written by the user


@operation()
def put_sum(local_tar: str, remote_sum: str, needed: bool = True):
    """
    Upload the controller's recorded sum of the wheel, root-owned, for :func:`install` to check.

    + local_tar: the controller's copy (its sum: ``local_tar.sha256``)
    + remote_sum: destination on this host, outside the training user's reach
    + needed: False on hosts whose apex is current (no-op)
    """
    if not needed:
        host.noop("apex wheel sum: not needed here")
        return
    yield from files.put._inner(
        src=f"{local_tar}.sha256", dest=remote_sum, mode="644", add_deploy_dir=False,
        assume_exists=True,
    )  # fmt: skip


@operation()
def install(
    python: str,
    wheel_tar: str,
    key: str,
    env_dir: str,
    verify: str = "import torch, apex, apex_C",
    sha256_file: str | None = None,
    fresh_env: bool = False,
    force: bool = False,
    user: str | None = None,
):
    """
    ``pip install --no-deps`` the wheel in ``wheel_tar``; record ``key`` in the env.

    + python: the env's interpreter
    + wheel_tar: tar holding one ``apex-*.whl`` on this host
    + key: build key of that wheel
    + env_dir: the conda env dir (holds the key file)
    + verify: python code that must import after the install (the real extension modules:
      importing FusedLayerNorm proves nothing, its import is lazy)
    + sha256_file: the controller's sum of the tar on this host (:func:`put_sum`); the tar
      must match it before anything of it is unpacked
    + fresh_env: the env is (re)created earlier in this run: ignore what the facts saw
    + force: reinstall even when the key matches
    + user: run the commands as this user (``su``); None = as connected
    """
    key_file = f"{env_dir.rstrip('/')}/{KEY_FILE}"
    if not fresh_env and not force:
        recorded = ask(host, MarkerText, path=key_file, user=user)
        installed = "apex" in ask(host, EnvDistributions, python=python, user=user)
        if recorded == key and installed:
            host.noop(f"apex already installed at build key {key}")
            return
        if recorded and recorded != key:
            host.log(f"apex installed at build key {recorded}, the spec needs {key}")
    unpacked = f"{wheel_tar}.d"
    if sha256_file is None:
        raise ValueError("apex.install: sha256_file is required (the wheel is checked)")
    yield as_user(
        user,
        StringCommand(
            "want=$(cut -c1-64",
            QuoteString(sha256_file),
            ") && got=$(sha256sum",
            QuoteString(wheel_tar),
            '| cut -c1-64) && [ "$want" = "$got" ] || { echo',
            QuoteString(f"host {host.name}: apex install: {wheel_tar}: sha256"),
            '"$got",',
            QuoteString("the controller recorded"),
            '"$want"',
            QuoteString(
                f"({sha256_file}): cut short or swapped, refused — fix: re-run (the controller's "
                "checked copy is uploaded again)"
            ),
            ">&2; rm -f",
            QuoteString(wheel_tar),
            "; exit 1; } && rm -rf",
            QuoteString(unpacked),
            "&& mkdir -p",
            QuoteString(unpacked),
            "&& tar -xf",
            QuoteString(wheel_tar),
            "-C",
            QuoteString(unpacked),
        ),
    )
    yield as_user(
        user,
        StringCommand(
            pip_command(python, "install --no-deps --force-reinstall"),
            StringCommand(QuoteString(unpacked), "/apex-*.whl", _separator=""),
        ),
    )
    yield as_user(user, StringCommand(QuoteString(python), "-c", QuoteString(verify)))
    yield as_user(
        user, StringCommand("printf '%s\\n'", QuoteString(key), ">", QuoteString(key_file))
    )
