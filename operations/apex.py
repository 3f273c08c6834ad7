"""Apex: built once per fleet and build key, then installed from the wheel on every host.

The build key and its arithmetic are ``p40fleet/apex_build.py``. Per key and pyinfra run,
exactly one host builds (``operations/run/apex_fleet.builder``: the first host of the inventory
that needs that key):

    builder:  build_wheel -> fetch_wheel (files.get of root's copy to the controller cache)
    all:      put_wheel (from the controller cache), put_sum, install (check the wheel's
              sha256, pip install --no-deps it; record the key)

pyinfra runs each operation on every host before the next one starts, so the builder's build
and fetch finish before any host's put. A wheel already in the controller cache whose sha256
matches the sum recorded next to it (``apex-wheel.tar.sha256``) means no build at all; to force
a rebuild, delete ``<controller cache>/apex/<key>/``.

Integrity (S8): the builder compiles as a dedicated build account (``build_wheel``: a system
account nothing else runs as, created afresh in an empty home outside ``/home`` and removed
after the build) from a snapshot of the env taken when the build starts, so nothing the
training user changes later reaches the wheel. Root takes the tar out of the build's home once
the account is gone and computes its sha256 itself; the controller fetches root's copy and
root's sum under temporary names, checks the tar against that sum and only then records the
sum and renames the tar into place. The controller's copy is checked against its recorded sum
when the run is planned (a mismatch means "not built": this run rebuilds it) and again before
each upload; each host (the builder too) gets the tar uploaded into the training user's cache
and checks it against the controller's sum (uploaded root-owned) right before ``pip install``.

Build flags (stack facts §4): ``--no-build-isolation`` (the build imports torch),
``--config-settings "--build-option=--cpp_ext"`` and, when the torch pin is a CUDA build,
``"--build-option=--cuda_ext"`` with ``CUDA_HOME`` = the pinned toolkit (apex stops when nvcc and
``torch.version.cuda`` differ). The env snapshot's ``bin/`` leads PATH, so torch's
``BuildExtension`` finds the torch lock's ``ninja`` and compiles ``MAX_JOBS`` jobs at once
(``p40fleet.apex_build.max_jobs``: CPUs and memory); without it torch falls back to serial
distutils and ignores ``MAX_JOBS`` (the build log's first line says which it was).
"""

from __future__ import annotations

import os
import posixpath
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, Host, QuoteString, StringCommand, operation
from pyinfra.operations import files

from p40fleet import apex_cache
from p40fleet.apex_build import (
    BUILD_ACCOUNT,
    BUILD_HOME,
    BUILD_LOG_DIR,
    KEY_FILE,
    WHEEL_TAR,
    built_tar,
    complete_wheel_tar,
    controller_wheel_ok,
    recorded_sum,
    sha256_of,
)
from p40fleet.facts.env import EnvDistributions, MarkerText, env_python
from p40fleet.facts.env import env_dir as conda_env_dir
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.refuse import refuse_option_ref
from p40fleet.operations.torch import pip_command
from p40fleet.operations.util.as_user import as_user, mkdir_as, put_as, write_as
from p40fleet.operations.util.progress import Stopwatch
from p40fleet.privdrop import STAGE_DIR
from p40fleet.proxy import proxied
from p40fleet.spec import Proxy, StackSpec

__all__ = [
    "build_wheel",
    "collect_script",
    "fetch_wheel",
    "install",
    "needed",
    "prepare_script",
    "put_sum",
    "put_wheel",
    "survey_parts",
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


def _account_gone(account: str) -> str:
    """Shell: no process of ``account`` is left (SIGKILL until none, bounded), its crontab and
    its files in the shared tmp dirs are removed, then the account and its group. Nothing it
    started (a daemon, a cron job) outlives the build or waits for the next account of the
    name or uid. Only this system's processes: those in root's own mount namespace with the
    account's uid (``pkill -u`` would also kill a container's processes that run as the same
    number, e.g. uid 999 in a Docker image, and every nested namespace's)."""
    a = _sq(account)
    pids = (
        "p40fleet_pids() { _me=$(readlink /proc/$$/ns/mnt); _n=$(id -u " + a + "); "
        'for _d in /proc/[0-9]*; do [ "$(stat -c %u "$_d" 2>/dev/null)" = "$_n" ] || continue; '
        '[ "$(readlink "$_d/ns/mnt" 2>/dev/null)" = "$_me" ] && echo "${_d#/proc/}"; '
        "done; true; }; "
    )
    return (
        f"if id -u {a} >/dev/null 2>&1; then {pids}i=0; "
        'while _p=$(p40fleet_pids) && [ -n "$_p" ]; do '
        "kill -KILL $_p 2>/dev/null; i=$((i+1)); if [ $i -gt 100 ]; then "
        f"echo {_sq(f'apex build: processes of {account} survive SIGKILL: refused')} >&2; "
        f"exit 1; fi; sleep 0.1; done; crontab -r -u {a} >/dev/null 2>&1 || true; "
        f"find /tmp /var/tmp /dev/shm -xdev -mindepth 1 -maxdepth 1 -user {a} "
        "-exec rm -rf -- {} + 2>/dev/null || true; "
        f"userdel -f {a} || exit 1; fi; "  # -f: a container's process of the uid stays
        f"if getent group {a} >/dev/null; then groupdel {a} || exit 1; fi"
    )


def _sq(text: str) -> str:
    return shlex.quote(text)


def prepare_script(account: str, home: str) -> str:
    """Shell (root): the build account created afresh (system account, no login shell, no
    password, home ``home`` made empty for this build, 0700); one left by an interrupted build
    is removed first, its processes killed."""
    a, h = _sq(account), _sq(home)
    return (
        f"{_account_gone(account)}; rm -rf {h} && install -d -m 755 "
        f"{_sq(posixpath.dirname(home.rstrip('/')))} && useradd --system --user-group "
        f"--no-create-home --home-dir {h} --shell /usr/sbin/nologin {a} && "
        f"install -d -m 700 -o {a} -g {a} {h}"
    )


def collect_script(account: str, home: str, staged: str, log_copy: str) -> str:
    """Shell (root), after the build: the build account's processes killed and the account
    removed (so nothing can change its files any more), then root copies the tar (a regular
    file, not a link) out of ``home`` into its own ``staged`` and writes ITS sha256 of that
    copy next to it, keeps the build log (bounded) as ``log_copy``, and removes ``home``.
    Exit 1 with a message when there is no tar (the build failed: the log is kept)."""
    h, t, lg = _sq(home), _sq(f"{home}/{WHEEL_TAR}"), _sq(f"{home}/build.log")
    st, sm = _sq(staged), _sq(f"{staged}.sha256")
    no_tar = _sq(f"apex build: no {WHEEL_TAR} (a regular file) in {home}: the build failed")
    return (
        f"{_account_gone(account)} && install -d -m 755 {_sq(posixpath.dirname(log_copy))} && "
        f"if [ -f {lg} ] && [ ! -L {lg} ]; then {{ date -u '+=== apex build, %F %T UTC'; "
        f"tail -c 4000000 {lg}; }} >> {_sq(log_copy)}; fi; "
        f"rm -f {st} {sm}; "
        f"if [ ! -f {t} ] || [ -L {t} ]; then echo {no_tar} >&2; rm -rf {h}; exit 1; fi; "
        f"install -d -m 700 {_sq(posixpath.dirname(staged))} && "
        f"cp -- {t} {st} && sha256sum {st} | cut -c1-64 > {sm}.tmp && mv -f {sm}.tmp {sm} && "
        f"rm -rf {h}"
    )


@operation()
def build_wheel(
    python: str,
    env_dir: str,
    remote: str,
    ref: str,
    commit: str,
    key: str,
    cuda_home: str,
    arch_list: str,
    max_jobs: int,
    cuda_ext: bool,
    user: str,
    needed: bool = True,
    proxy: Proxy | None = None,
    account: str = BUILD_ACCOUNT,
    home: str = BUILD_HOME,
):
    """
    Build one wheel of apex at ``ref`` (verified = ``commit``) as the build account; root keeps
    its own copy of the tar and its own sha256 of it (``built_tar(STAGE_DIR, key)``).

    + python: the env's interpreter (its torch is the build's torch), under ``env_dir``
    + env_dir: the conda env dir (the training user's)
    + remote: git remote of apex
    + ref: tag or branch to check out
    + commit: the commit ``ref`` must resolve to
    + key: the build key (names root's copy and the kept log)
    + cuda_home: CUDA toolkit for ``--cuda_ext`` (must match torch.version.cuda)
    + arch_list: TORCH_CUDA_ARCH_LIST, only the arches present
    + max_jobs: MAX_JOBS for the compiler (``p40fleet.apex_build.max_jobs``)
    + cuda_ext: build the CUDA extensions too
    + user: the training user (owns the env; streams its snapshot, nothing else)
    + proxy: ``stack.proxy`` for the fetch (None: no proxy)
    + needed: False when this host is not the build key's builder in this run (no-op)
    + account, home: the build account and its home (tests move them)

    S8, what the build trusts: the env's content as it is when the build starts (this run's
    hash-locked installs made it; the training user owns it and could change it at any time).
    The user's ``tar`` streams it once into the build account's fresh home, and the build runs
    only that snapshot: ``python -I`` (no PYTHON* variables, no user site), ``env -i`` (a
    fixed PATH: the snapshot's ``bin/`` for ``ninja``, the toolkit's, the system's; HOME and
    TMPDIR in the build's home), ``PIP_CONFIG_FILE=/dev/null`` (no pip
    config of anybody's). Nothing the training user (or a Ray job, a ``.pth`` it adds later)
    changes after that reaches the build: its home is 0700 of an account nothing else runs as,
    created for this build and removed after it (its processes killed first). The pinned
    source is cloned by that account and checked against ``commit``. Root takes the tar out
    of that home only once the account is gone and computes the sum itself: that sum is what
    the controller records and every host checks before installing (as the training user).
    """
    if not needed:
        host.noop("apex wheel: built by another host or already on the controller")
        return
    if ref.startswith("-"):
        yield from refuse_option_ref("apex build", ref, "stack.apex.ref", "25.09")
        return
    snap = f"{home}/env"
    snap_python = snap + python[len(env_dir.rstrip("/")) :]
    src, wheels, log = f"{home}/src", f"{home}/wheels", f"{home}/build.log"
    kept_log = f"{BUILD_LOG_DIR}/apex-build-{key}.log"
    host.log(
        f"apex build as {account} (minutes; compiles C++/CUDA): log on this host at {log}, "
        f"kept as {kept_log}"
    )
    yield StringCommand(prepare_script(account, home))
    # the env, once: the training user's tar into the build account's own copy
    q_snap = QuoteString(snap)
    yield StringCommand(
        as_user(user, StringCommand("tar -C", QuoteString(env_dir), "-cf - .")),
        "</dev/null |",
        as_user(
            account,
            StringCommand(
                "mkdir",
                q_snap,
                "&& tar -C",
                q_snap,
                "--no-same-owner -xf - && test -e",
                QuoteString(snap_python),
            ),  # fmt: skip
        ),
    )
    q_src = QuoteString(src)
    clone = StringCommand("git clone --quiet", QuoteString(remote), q_src)
    yield proxied(as_user(account, clone), proxy)
    yield as_user(
        account,
        StringCommand(
            "git -C", q_src, "-c advice.detachedHead=false checkout --quiet", QuoteString(ref)
        ),
    )
    yield as_user(
        account,
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
    # The snapshot's bin/ first, as an activated env has it: torch's BuildExtension runs
    # `ninja` from PATH (the torch lock's ninja wheel puts the binary itself there) and without
    # it compiles serially through distutils, MAX_JOBS unused.
    snap_bin = f"{snap}/bin"
    backend = QuoteString(f"apex build: ninja from the env, MAX_JOBS={max_jobs} parallel jobs")
    serial = QuoteString(
        f"apex build: WARNING: no {snap_bin}/ninja (files/torch-requirements-*.txt lists it): "
        "torch compiles serially, MAX_JOBS unused"
    )
    build = StringCommand(
        "mkdir -p",
        QuoteString(wheels),
        QuoteString(f"{home}/tmp"),
        "&& start=$(date +%s) && if [ -x",
        QuoteString(f"{snap_bin}/ninja"),
        "]; then echo",
        backend,
        ">",
        QuoteString(log),
        "; else echo",
        serial,
        "| tee",
        QuoteString(log),
        ">&2; fi && cd",
        q_src,
        "&& env -i",
        QuoteString(
            f"PATH={snap_bin}:{cuda_home}/bin:"
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        ),
        QuoteString(f"HOME={home}"),
        QuoteString(f"TMPDIR={home}/tmp"),
        "PIP_CONFIG_FILE=/dev/null PYTHONNOUSERSITE=1 LANG=C.UTF-8",
        QuoteString(f"CUDA_HOME={cuda_home}"),
        QuoteString(f"TORCH_CUDA_ARCH_LIST={arch_list}"),
        QuoteString(f"MAX_JOBS={max_jobs}"),
        QuoteString(snap_python),
        "-I -m pip --disable-pip-version-check",
        "wheel -v --no-cache-dir --no-build-isolation --no-deps -w",
        QuoteString(wheels),
        *settings,
        "./",
        ">>",
        QuoteString(log),
        "2>&1 || { tail -n 40",
        QuoteString(log),
        "; echo",
        QuoteString("apex build failed after"),
        '"$(( $(date +%s) - start ))s, full log:"',
        QuoteString(kept_log),
        ">&2; exit 1; }; echo",
        QuoteString("apex build took"),
        '"$(( $(date +%s) - start ))s, log:"',
        QuoteString(kept_log),
        "| tee -a",
        QuoteString(log),
        "&& cd",
        QuoteString(wheels),
        "&& tar -cf",
        QuoteString(f"{home}/{WHEEL_TAR}"),
        "apex-*.whl",
    )
    watch = Stopwatch("apex build", log=log)  # kept_log once it ended
    yield watch.start()
    # the build and root's collection in one command: a failed build leaves no account behind
    yield StringCommand(
        as_user(account, build),
        "; rc=$?;",
        StringCommand(collect_script(account, home, built_tar(STAGE_DIR, key), kept_log)),
        "|| exit 1; exit $rc",
    )
    yield watch.stop()


@operation()
def fetch_wheel(remote_tar: str, local_tar: str, needed: bool = True):
    """
    Copy root's copy of the wheel tar and root's sum of it to the controller; record the sum.

    + remote_tar: root's copy on the builder (``built_tar``; ``remote_tar.sha256``: root's sum,
      taken after the build account was gone, :func:`build_wheel`)
    + local_tar: where the controller keeps it (one dir per build key)
    + needed: False on hosts that did not build it (no-op)

    Both land under temporary names; ``local_tar.sha256`` is written (temp name, then rename)
    and the tar renamed into place only after the copy matches root's sum and is a complete
    wheel tar, so an interrupted copy is never taken for the wheel. Root's copies on the
    builder are removed after the fetch. The temporary names are this controller process's, and
    the tar is recorded only while this run still holds the key's build lock in a shared cache
    (``apex_cache.record``): once taken over, the new holder's wheel is the one recorded.
    """
    if not needed:
        host.noop("apex wheel: not built here")
        return
    part = apex_cache.part_of(local_tar)  # this process's: a taken-over builder writes its own
    part_sum = f"{part}.sha256"
    for src, dest in ((remote_tar, part), (f"{remote_tar}.sha256", part_sum)):
        yield from files.get._inner(
            src=src, dest=dest, add_deploy_dir=False, create_local_dir=True, force=True
        )
    yield StringCommand("rm -f", QuoteString(remote_tar), QuoteString(f"{remote_tar}.sha256"))

    def _record(state, host) -> bool:
        try:
            return _stored(state, host)
        finally:
            apex_cache.release_for(state, local_tar)  # stored or not: others may go on

    def _stored(state, host) -> bool:
        want, got = recorded_sum(part_sum), sha256_of(part) if os.path.isfile(part) else None
        problem = None
        if want is None or got != want:
            problem = f"copy has sha256 {got}, the builder's root took {want} (cut short)"
        else:
            problem = complete_wheel_tar(part)
        if problem:
            for name in (part, part_sum):  # this process's names: none is reused by a re-run
                if os.path.exists(name):
                    os.unlink(name)
            host.log_styled(
                f"host {host.name}: apex wheel fetch: {remote_tar}: {problem} — fix: re-run "
                "(the builder builds it again; nothing was recorded on the controller)",
                fg="red",
            )
            return False
        try:
            apex_cache.record(part, local_tar, got, lock=apex_cache.lock_for(state, local_tar))
        except apex_cache.LockLost as lost:  # the new holder records its wheel; uploads wait
            host.log_styled(f"host {host.name}: apex wheel fetch: {lost}: not recorded; "
                            "this run's uploads wait for that wheel", fg="yellow")  # fmt: skip
        finally:
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
        waited = apex_cache.await_other(local_tar, lambda line: host.log_styled(line, fg="yellow"))
        if waited is not None:
            ok, why = waited
            if ok:
                return True
            host.log_styled(
                f"host {host.name}: apex wheel upload: {why} — fix: re-run (this controller "
                "then builds it, or uses the wheel once stored)",
                fg="red",
            )
            return False
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
    yield write_as(user, key_file, key)


def survey_parts(spec: StackSpec) -> list[Part]:
    """What :func:`needed` and :func:`install` ask on a converged host (``operations.run.survey``;
    a converged host builds nothing)."""
    env, by_user = spec.env, {"user": spec.user.name}
    the_env = conda_env_dir(env.conda_prefix, env.name)
    return [
        part(MarkerText, path=f"{the_env}/{KEY_FILE}", **by_user),
        part(EnvDistributions, python=env_python(env.conda_prefix, env.name), **by_user),
    ]
