"""Download an artifact into the host cache, verified by sha256 before it gets its real name.

On the host, for ``/var/cache/p40fleet/X.run``::

    X.run.lock       flock(1) held for the whole download: one run at a time fetches X.run
    X.run.part       the download in progress; an interrupted one is resumed (HTTP range),
                     one the mirror cannot resume (no Range support, longer than the file)
                     is fetched whole once
    X.run            renamed from .part only after the sha256 of the WHOLE file matched
    X.run.verified   marker ``SIZE MTIME SHA256``: a re-run compares size + mtime, never re-hashes

Download, verify, rename and marker are ONE shell command run under the lock, so two runs can
never move each other's half-written file into place. A resumed file whose sum is wrong (the
mirror's copy changed under it) is deleted and fetched whole once more. The command prints its
progress (every 10 % or 30 s) and pyinfra shows it at default verbosity (operations.util.progress).

A file already there without a valid marker (copied in by hand, touched, or not root's) is
hashed once: kept if its sum matches, downloaded again if not. The cache dir must be root's and
not world-writable: root runs what is in it.

With ``stack.mirror.push_from_controller`` (:func:`push`) the host downloads nothing: the
controller fetches each file once per run into its own cache (``p40fleet.artifact_push``,
sha256-checked there), ``files.put`` uploads it into root's 0700 ``.p40fleet-push/`` inside
the cache, and the host hashes that copy under ``X.run.lock`` before renaming it to ``X.run``
and writing the same marker. A verified ``X.run`` is never sent again.
"""

from __future__ import annotations

import posixpath
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path

from pyinfra import host
from pyinfra.api import FunctionCommand, Host, QuoteString, State, StringCommand, operation
from pyinfra.operations import files

from p40fleet.artifact_push import PushError, controller_artifact, controller_copy
from p40fleet.facts.artifacts import ArtifactFile, ArtifactState, marker_path
from p40fleet.facts.host import FreeSpace
from p40fleet.facts.survey import Part, ask, part
from p40fleet.operations.refuse import refuse
from p40fleet.operations.util.progress import streamed
from p40fleet.proxy import shell_prefix
from p40fleet.run_record import run_record
from p40fleet.spec import ARTIFACTS, Proxy, StackSpec

__all__ = [
    "artifact",
    "artifact_path",
    "download_command",
    "fetch",
    "format_bytes",
    "install_command",
    "parent_remedy",
    "push",
    "push_dir",
    "staging_command",
    "survey_parts",
]


def format_bytes(count: int) -> str:
    """``4336730777`` -> ``4.34 GB (4336730777 bytes)``."""
    return f"{count / 1e9:.2f} GB ({count} bytes)"


def artifact_path(spec: StackSpec, name: str) -> str:
    """Where artifact ``name`` lives on the host (the spec's artifact cache)."""
    return posixpath.join(spec.paths.artifact_cache, spec.artifact(name).filename)


# Limits of one transfer (security N5), kept here so the curl/wget command lines stay short:
# give up on a mirror that does not connect in 30 s, or sends under 1 KiB/s for 120 s (curl's
# exit 28, wget's 4: the .part is kept for the next run), and never accept more bytes than the
# pin's size (curl --max-filesize; the watch loop below stops wget, or a curl whose mirror
# sends no Content-Length, at the first byte past it).
CURL_LIMITS = "--connect-timeout 30 --speed-limit 1024 --speed-time 120"
WGET_LIMITS = "--connect-timeout=30 --read-timeout=120"
# Exits that mean "the mirror stopped answering", not "this .part cannot be resumed": curl's
# resolve/connect/timeout/partial/recv errors, wget's network failure.
_STOPPED_EXITS = "5 6 7 18 28 35 52 55 56"
_WGET_STOPPED_EXITS = "4"


def _limits(size: int | None) -> tuple[str, str]:
    """curl's and wget's options for one transfer of a file of ``size`` bytes (if known)."""
    curl = CURL_LIMITS + (f" --max-filesize {int(size)}" if size else "")
    return curl, WGET_LIMITS


def _fetch_function(url: str, size: int | None = None) -> str:
    """Shell function ``fetch RESUME``: curl (or wget) to ``$p``, printing progress lines.

    Sets ``$stops`` to the exit codes after which the ``.part`` is worth resuming."""
    q_url = shlex.quote(url)
    curl_limits, wget_limits = _limits(size)
    return (
        "fetch() { "
        'if [ "$1" = 1 ] && [ -s "$p" ]; then '
        'echo "$n: resuming from byte $(stat -c %s "$p")"; c="-C -"; w="-c"; '
        'else rm -f "$p"; c=""; w=""; fi; '
        "if command -v curl >/dev/null 2>&1; then "
        f'stops="{_STOPPED_EXITS}"; '
        f'curl -fsSL --retry 3 $c {curl_limits} -o "$p" {q_url} & '
        f'else stops="{_WGET_STOPPED_EXITS}"; '
        f'wget -q --tries=3 $w {wget_limits} -O "$p" {q_url} & fi; '
        "pid=$!; t0=$(date +%s); last=$t0; step=-1; big=0; "
        "while kill -0 $pid 2>/dev/null; do sleep 1; now=$(date +%s); "
        'have=$(stat -c %s "$p" 2>/dev/null || echo 0); '
        'if [ -n "$size" ] && [ "$size" -gt 0 ]; then '
        'if [ "$have" -gt "$size" ]; then big=1; kill $pid 2>/dev/null; fi; '
        "pct=$((have * 100 / size)); "
        "if [ $((pct / 10)) -gt $step ] || [ $((now - last)) -ge 30 ]; then "
        'echo "$n: $pct % ($have of $size bytes, $((now - t0)) s)"; '
        "step=$((pct / 10)); last=$now; fi; "
        "elif [ $((now - last)) -ge 30 ]; then "
        'echo "$n: $have bytes ($((now - t0)) s)"; last=$now; fi; done; '
        "wait $pid; r=$?; "
        'if [ $big = 1 ] || { [ -n "$size" ] && [ "$(stat -c %s "$p" 2>/dev/null || echo 0)" '
        '-gt "$size" ]; }; then rm -f "$p"; '
        'echo "$n: the mirror sent more than the pinned $size bytes: deleted" >&2; r=63; fi; '
        "return $r; }"
    )


class _Var(str):
    """A shell variable's name, expanded inside double quotes by :func:`_say`."""


def _say(*parts: str) -> str:
    """A ``printf`` of ``parts`` and a newline: text single-quoted, :class:`_Var` as "$name"."""
    words = [f'"${part}"' if isinstance(part, _Var) else shlex.quote(part) for part in parts]
    return "printf '" + "%s" * len(parts) + "\\n' " + " ".join(words)


def download_command(
    url: str,
    sha256: str,
    dest_dir: str,
    filename: str,
    size: int | None = None,
    proxy: Proxy | None = None,
) -> StringCommand:
    """The one command that locks, resumes or downloads, verifies, renames and marks (through
    ``proxy``, ``stack.proxy``, when given).

    Exit 0 only when ``dest_dir/filename`` has the pinned sum and a fresh marker. Any other
    outcome exits non-zero with a line naming the cause and the fix; a ``.part`` that merely
    stopped (mirror down, network cut, a stall) is kept for the next run to resume, one the
    mirror cannot resume (no Range support, a 416, a wrong sum) is fetched whole at once.
    """
    sha256 = sha256.lower()
    path = posixpath.join(dest_dir, filename)
    # Every message is printf'd with its text single-quoted: a URL or file name is never
    # parsed by the shell (security S5), only the $variables named here are expanded.
    mismatch = _say(
        f"sha256 mismatch for {filename} (from {url}): expected {sha256}, got ", _Var("got"),
        f"; the download was deleted. Remedy: check the mirror's copy of {filename} "
        "(sha256sum it there) or correct the sha256 in the stack spec, then re-run",
    )  # fmt: skip
    unsafe_dir = _say(
        f"{dest_dir} is owned by uid ", _Var("o"), " with mode ", _Var("mo"),
        f": another account could plant a file there that root then runs. Remedy: chown "
        f"root:root {dest_dir} && chmod 0755 {dest_dir}, or set stack.paths.artifact_cache "
        "to a root-only directory, then re-run",
    )  # fmt: skip
    busy = _say(
        f"another p40fleet run is downloading {filename} (it holds {path}.lock). "
        "Remedy: wait for that run to finish, then re-run"
    )
    stopped = _say(
        f"download of {filename} from {url} stopped (curl/wget exit ", _Var("rc"),
        f"); the partial file {path}.part is kept and the next run resumes it. Remedy: check "
        "that the mirror answers, then re-run",
    )  # fmt: skip
    script = " ".join(
        [
            shell_prefix(proxy) + f'd={shlex.quote(dest_dir)}; f={shlex.quote(path)}; p="$f.part"; '
            f"m={shlex.quote(marker_path(path))}; n={shlex.quote(filename)}; "
            f"want={sha256}; size={size or ''}; ",
            # 0755, not 0700: the Miniconda installer in here runs as the training user.
            'mkdir -p -m 0755 "$d" || exit 1; ',
            'o=$(stat -c %u "$d"); mo=$(stat -c %a "$d"); ',
            'if [ "$o" != 0 ] || [ $((0$mo & 2)) != 0 ]; then ',
            f"{unsafe_dir} >&2; exit 1; fi; ",
            'exec 9>>"$f.lock"; ',
            "if command -v flock >/dev/null 2>&1 && ! flock -n 9; then ",
            f"{busy} >&2; exit 1; fi; ",
            "sum() { sha256sum \"$1\" | cut -d' ' -f1; }; ",
            _fetch_function(url, size) + "; ",
            'if [ -f "$f" ] && [ "$(sum "$f")" = "$want" ]; then ',
            'echo "$n: already in $d, sha256 matches"; else ',
            'rm -f "$f" "$m"; resumed=0; [ -s "$p" ] && resumed=1; ',
            # A .part longer than the pinned file can only be wrong: never resume it.
            'if [ $resumed = 1 ] && [ -n "$size" ] && [ "$(stat -c %s "$p")" -gt "$size" ]; then ',
            'echo "$n: the partial file has $(stat -c %s "$p") bytes, more than the pinned '
            '$size: fetching it whole"; rm -f "$p"; resumed=0; fi; ',
            'fetch $resumed; rc=$?; got=$(sum "$p" 2>/dev/null); ',
            # A resumed .part that fails (416 on a complete file) may still be whole. One that
            # the mirror cannot resume (no Range support: curl 33, a 416, a wrong sum) is
            # fetched whole once; one cut by the network (a $stops exit) is kept to resume.
            'if [ "$got" != "$want" ] && [ $resumed = 1 ]; then '
            'case " $stops " in *" $rc "*) ;; *) ',
            'if [ $rc = 0 ]; then echo "$n: sha256 of the resumed file is $got, not $want: '
            'fetching it whole"; else echo "$n: the mirror did not resume the partial file '
            '(curl/wget exit $rc): fetching it whole"; fi; ',
            'fetch 0; rc=$?; got=$(sum "$p" 2>/dev/null); ;; esac; fi; ',
            'if [ $rc != 0 ] && [ "$got" != "$want" ]; then ',
            f"{stopped} >&2; exit 1; fi; ",
            f'if [ "$got" != "$want" ]; then rm -f "$p"; {mismatch} >&2; exit 1; fi; ',
            'mv -f "$p" "$f" && echo "$n: sha256 verified ($want)"; fi; ',
            'echo "$(stat -c \'%s %Y\' "$f") $want" > "$m.tmp" && mv -f "$m.tmp" "$m"',
        ]
    )
    return StringCommand("sh", "-c", QuoteString(script))


def parent_remedy(problem: str, field: str) -> str:
    """The fix for :func:`facts.artifacts.parent_problem`'s ``problem`` (``PATH is ...``)."""
    where = problem.split(" is ", 1)[0]
    return (
        f"make {where} root's (chown root:root {where} && chmod go-w {where}, or chmod +t "
        f"{where} if others must write there), or set {field} to a directory whose parents "
        "only root can change (e.g. under /var/cache)"
    )


def _unsafe_cache(state: ArtifactFile, filename: str, dest_dir: str) -> Iterator:
    """Yield the refusal for a cache dir root must not use; returns whether it refused
    (``refused = yield from _unsafe_cache(...)``)."""
    if state.dir_problem:
        yield from refuse._inner(
            step=f"download {filename}",
            reason=f"the artifact cache {dest_dir} is {state.dir_problem}: another account "
            "could put a file there that root then runs",
            remedy=f"chown root:root {dest_dir} && chmod 0755 {dest_dir}, or set "
            "stack.paths.artifact_cache to a directory only root can write",
        )
        return True
    if state.parent_problem:
        yield from refuse._inner(
            step=f"download {filename}",
            reason=f"the artifact cache {dest_dir}: {state.parent_problem}: that account could "
            "swap the cache dir for one holding its own file, which root then runs (S7)",
            remedy=parent_remedy(state.parent_problem, "stack.paths.artifact_cache"),
        )
        return True
    return False


def _no_room(state: ArtifactFile, filename: str, dest_dir: str, size: int | None) -> Iterator:
    """Yield the refusal for too little free space for a file not there yet; returns whether
    it refused."""
    if size is None or state.present:
        return False
    space = ask(host, FreeSpace, path=dest_dir)
    free = space.available_bytes if space else None
    if free is None or free >= size:
        return False
    yield from refuse._inner(
        step=f"download {filename}",
        reason=(
            f"not enough free space for {filename} in {dest_dir}: needs "
            f"{format_bytes(size)}, {format_bytes(free)} free, "
            f"{format_bytes(size - free)} missing"
        ),
        remedy=(
            f"free {format_bytes(size - free)} on the filesystem of {dest_dir} or set "
            "stack.paths.artifact_cache to a directory on a filesystem with room"
        ),
    )
    return True


def _guard(
    dest_dir: str, filename: str, sha256: str, size: int | None, verified: str, present: str
) -> Iterator:
    """The checks :func:`fetch` and :func:`push` make first: yield the refusal for an unsafe
    cache or too little room; ``host.noop`` (its message ending in ``verified``) when the file
    is there, verified; ``host.log`` (ending in ``present``) when a file is there untrusted.
    Returns whether the operation stops here (``if (yield from _guard(...)): return``)."""
    state = ask(host, ArtifactState, path=posixpath.join(dest_dir, filename))
    if (yield from _unsafe_cache(state, filename, dest_dir)):
        return True
    if state.verified(sha256):
        host.noop(f"{filename} is in {dest_dir}, verified (sha256 {sha256[:12]}…){verified}")
        return True
    if (yield from _no_room(state, filename, dest_dir, size)):
        return True
    if state.present:
        why = state.untrusted or "no valid verified marker"
        host.log(f"{filename}: {why}: {present}")
    return False


@operation()
def fetch(
    url: str,
    sha256: str,
    dest_dir: str,
    filename: str | None = None,
    size: int | None = None,
    proxy: Proxy | None = None,
):
    """
    Download ``url`` into ``dest_dir`` and keep it only if its sha256 matches.

    + url: where to download from (mirror or upstream)
    + sha256: expected sum (64 hex)
    + dest_dir: the host's artifact cache (created if missing)
    + filename: file name in the cache (default: last part of the URL)
    + size: expected size in bytes, if known: free space is checked before downloading
    + proxy: ``stack.proxy`` (None: no proxy)
    """
    sha256 = sha256.lower()
    filename = filename or posixpath.basename(url.split("?", 1)[0])
    if (yield from _guard(dest_dir, filename, sha256, size, "", "checking its sha256 once")):
        return
    yield streamed(
        download_command(url, sha256, dest_dir, filename, size, proxy), what=f"download {filename}"
    )


#: In the artifact cache: root's 0700 dir where an upload lands before it is checked and
#: renamed into place (the cache itself is 0755: the Miniconda installer runs as the user).
PUSH_DIR = ".p40fleet-push"


def push_dir(dest_dir: str) -> str:
    """Root's 0700 staging dir for uploads into the artifact cache ``dest_dir``."""
    return posixpath.join(dest_dir, PUSH_DIR)


def staging_command(dest_dir: str) -> StringCommand:
    """Make the cache dir (root's, not world-writable: checked) and its 0700 staging dir: an
    upload there cannot meet a link or a file another account made (only root writes in it)."""
    unsafe_dir = _say(
        f"{dest_dir} is owned by uid ", _Var("o"), " with mode ", _Var("mo"),
        f": another account could plant a file there that root then runs. Remedy: chown "
        f"root:root {dest_dir} && chmod 0755 {dest_dir}, or set stack.paths.artifact_cache "
        "to a root-only directory, then re-run",
    )  # fmt: skip
    script = (
        f"d={shlex.quote(dest_dir)}; s={shlex.quote(push_dir(dest_dir))}; "
        'mkdir -p -m 0755 "$d" || exit 1; o=$(stat -c %u "$d"); mo=$(stat -c %a "$d"); '
        'if [ "$o" != 0 ] || [ $((0$mo & 2)) != 0 ]; then '
        f"{unsafe_dir} >&2; exit 1; fi; "
        # never write through a link (or into anything but a dir) that stands there
        'if [ -L "$s" ] || { [ -e "$s" ] && [ ! -d "$s" ]; }; then rm -f "$s"; fi; '
        'mkdir -p -m 0700 "$s" && chown 0:0 "$s" && chmod 0700 "$s"'
    )
    return StringCommand("sh", "-c", QuoteString(script))


def install_command(staged: str, sha256: str, dest_dir: str, filename: str) -> StringCommand:
    """The host's own check of an upload: under the file's lock, ``staged``'s sha256 must be
    the pin, else it is deleted and the step fails naming file and sums; then it is renamed
    to ``dest_dir/filename`` (same filesystem: atomic; a link there is replaced, not followed)
    and marked verified like a download."""
    sha256 = sha256.lower()
    path = posixpath.join(dest_dir, filename)
    mismatch = _say(
        f"sha256 mismatch for {filename} uploaded from the controller: expected {sha256}, got ",
        _Var("got"), f"; the upload was deleted. Remedy: sha256sum the controller's copy "
        f"({controller_artifact(filename)}) and check the link to this host, then re-run",
    )  # fmt: skip
    busy = _say(
        f"another p40fleet run is writing {filename} (it holds {path}.lock). "
        "Remedy: wait for that run to finish, then re-run"
    )
    script = (
        f"f={shlex.quote(path)}; t={shlex.quote(staged)}; m={shlex.quote(marker_path(path))}; "
        f"n={shlex.quote(filename)}; want={sha256}; "
        'exec 9>>"$f.lock"; if command -v flock >/dev/null 2>&1 && ! flock -n 9; then '
        f"{busy} >&2; exit 1; fi; "
        "got=$(sha256sum \"$t\" 2>/dev/null | cut -d' ' -f1); "
        f'if [ "$got" != "$want" ]; then rm -f "$t"; {mismatch} >&2; exit 1; fi; '
        'rm -f "$m" && chmod 0644 "$t" && mv -f "$t" "$f" && rm -f "$f.part" || exit 1; '
        'echo "$n: uploaded from the controller, sha256 verified on this host ($want)"; '
        'echo "$(stat -c \'%s %Y\' "$f") $want" > "$m.tmp" && mv -f "$m.tmp" "$m"'
    )
    return StringCommand("sh", "-c", QuoteString(script))


_COPIES_GUARD = threading.Lock()


def controller_copy_once(
    run: State, url: str, sha256: str, filename: str, size: int | None
) -> tuple[Path | None, str | None]:
    """``(path, None)`` of the controller's verified copy, or ``(None, why)``: decided once per
    run and file for all hosts (kept in the run's record; hosts run in parallel and wait for
    the one fetch). Only at execution: a dry run or the planning pass never downloads."""
    key = (filename, sha256.lower())
    with _COPIES_GUARD:
        entry = run_record(run).controller_copies.setdefault(key, [threading.Lock(), None])
    with entry[0]:
        if entry[1] is None:
            try:
                entry[1] = (controller_copy(url, sha256, filename, size), None)
            except PushError as exc:
                entry[1] = (None, str(exc))
    return entry[1]


@operation()
def push(
    url: str,
    sha256: str,
    dest_dir: str,
    filename: str,
    size: int | None = None,
):
    """
    Upload an artifact from the controller's cache (``stack.mirror.push_from_controller``).

    + url: where the controller fetches it when its cache lacks it (mirror or upstream)
    + sha256: expected sum (64 hex): checked on the controller, then again on the host
    + dest_dir: the host's artifact cache (root's, created if missing)
    + filename: file name in both caches
    + size: expected size in bytes, if known: free space is checked before uploading

    Nothing is fetched or uploaded when the host's copy is verified. Else, at execution, the
    controller's copy (fetched once per run for all hosts, ``controller_copy_once``) goes to
    root's 0700 staging dir with ``files.put``; the host checks its sha256, renames and marks it.
    """
    sha256 = sha256.lower()
    replaced = "replaced by the controller's verified copy"
    if (yield from _guard(dest_dir, filename, sha256, size, ": not pushed", replaced)):
        return
    local = controller_artifact(filename)
    staged = posixpath.join(push_dir(dest_dir), filename)

    def _controller_copy(state: State, host: Host) -> bool:
        _path, why = controller_copy_once(state, url, sha256, filename, size)
        if why:
            host.log_styled(f"host {host.name}: push {filename}: {why}", fg="red")
            return False
        return True

    yield FunctionCommand(_controller_copy, (), {})
    yield staging_command(dest_dir)
    yield from files.put._inner(
        src=str(local), dest=staged, add_deploy_dir=False, create_remote_dir=False,
        force=True, assume_exists=True,
    )  # fmt: skip
    yield install_command(staged, sha256, dest_dir, filename)


@operation()
def artifact(item: str, spec: StackSpec):
    """
    Fetch the spec's artifact ``item`` (``driver``, ``cuda``, ``cudnn``, ``miniconda``).

    + item: the artifact's field in the stack spec (not ``name``: pyinfra takes that one)
    + spec: the host's StackSpec (mirror URL when it names one, else upstream; uploaded from
      the controller with ``mirror.push_from_controller``)
    """
    what = spec.artifact(item)
    url = spec.artifact_url(item)
    if spec.mirror is not None and spec.mirror.push_from_controller:
        yield from push._inner(
            url=url,
            sha256=what.sha256,
            dest_dir=spec.paths.artifact_cache,
            filename=what.filename,
            size=what.size,
        )
        return
    yield from fetch._inner(
        url=url,
        sha256=what.sha256,
        dest_dir=spec.paths.artifact_cache,
        filename=what.filename,
        size=what.size,
        proxy=spec.proxy,
    )


def survey_parts(spec: StackSpec) -> list[Part]:
    """The facts :func:`artifact` asks on a converged host, for every artifact of the spec
    (``operations.run.survey``); :func:`push` asks the same one."""
    return [part(ArtifactState, path=artifact_path(spec, item)) for item in ARTIFACTS]
