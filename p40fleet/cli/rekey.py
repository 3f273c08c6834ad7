"""Re-key a host after an OS reinstall: fetch its new SSH host key, show the fingerprint, and
replace its entry in the inventory's known_hosts only when the admin vouches for it.

    python -m p40fleet.rekey INVENTORY HOST [--expect SHA256:...] [--yes]

The address, port and known_hosts file come from the host's data in the inventory
(``ssh_hostname``, ``ssh_port``, ``ssh_known_hosts_file``; defaults: the host's name, 22,
``~/.ssh/known_hosts``; a relative path is taken against the repository root, where the CLIs
run pyinfra, whatever directory this is run from). The key is read during the SSH key exchange
(no login). Take the expected fingerprint from the host's console
(``ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub``), never from the network path being checked.

Exit codes: 0 entry replaced (or already current); 1 nothing changed (declined, no confirmation,
host unreachable, bad input); 2 the host's key does not match ``--expect`` (nothing changed).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import paramiko
from paramiko.hostkeys import HostKeys

# ``python -m p40fleet.deploy``/``verify`` run pyinfra in REPO, so a relative
# ``ssh_known_hosts_file`` (``inventories/known_hosts.lab``) names a file under it.
from p40fleet.paths import REPO

EXIT_OK, EXIT_UNCHANGED, EXIT_MISMATCH = 0, 1, 2


class RekeyError(RuntimeError):
    """A failure the CLI prints as one line (host, step, cause, fix)."""


@dataclass(frozen=True)
class Target:
    """Where HOST's sshd answers and which known_hosts file the inventory checks it against."""

    host: str
    address: str
    port: int
    known_hosts: Path

    @property
    def entry_name(self) -> str:
        """The name OpenSSH and paramiko look up: ``addr``, or ``[addr]:port`` off port 22."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


def fingerprint_of_blob(blob: bytes) -> str:
    """OpenSSH's ``SHA256:`` fingerprint (unpadded base64) of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def fingerprint(key: paramiko.PKey) -> str:
    return fingerprint_of_blob(key.asbytes())


def normalize_fingerprint(text: str) -> str:
    """``SHA256:abc=`` or ``sha256:abc`` -> ``SHA256:abc``; anything else is refused."""
    algo, sep, digest = text.strip().partition(":")
    if not sep or algo.upper() != "SHA256" or not digest:
        raise RekeyError(
            f"--expect {text!r}: not a SHA256 fingerprint; fix: pass it as "
            "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` prints it on the host (SHA256:...)"
        )
    return "SHA256:" + digest.rstrip("=")


def resolve(inventory: str, host: str) -> Target:
    """HOST's address, port and known_hosts file from the inventory (pyinfra's own loader, run
    from the repository root as the CLIs run it); the known_hosts path is absolute."""
    from p40fleet.runtime.inventory import load_inventory

    source = os.path.abspath(inventory) if os.path.isfile(inventory) else inventory
    try:
        inv = load_inventory(source, REPO)
    except Exception as exc:  # noqa: BLE001 - an inventory can fail in any way: name it
        raise RekeyError(f"inventory {inventory}: cannot load it: {exc}") from exc
    found = inv.get_host(host, None)
    if found is None:
        names = ", ".join(h.name for h in inv) or "none"
        raise RekeyError(f"{host}: not in inventory {inventory} (hosts: {names})")
    data = found.data
    known = data.get("ssh_known_hosts_file") or "~/.ssh/known_hosts"
    return Target(
        host=host,
        address=str(data.get("ssh_hostname") or host),
        port=int(data.get("ssh_port") or 22),
        known_hosts=known_hosts_path(str(known)),
    )


def known_hosts_path(known: str) -> Path:
    """The file pyinfra checks: ``~`` expanded, a relative path under :data:`REPO`."""
    path = Path(os.path.expanduser(known))
    return path if path.is_absolute() else REPO / path


def fetch_key(target: Target, prefer: tuple[str, ...] = (), timeout: float = 10.0) -> paramiko.PKey:
    """The host key the sshd presents in the key exchange (no authentication)."""
    where = f"{target.host} ({target.address}:{target.port})"
    try:
        sock = socket.create_connection((target.address, target.port), timeout=timeout)
    except OSError as exc:
        raise RekeyError(
            f"{where}: fetch host key: cannot connect: {exc}; fix: is the host up and "
            "ssh_hostname/ssh_port right in the inventory?"
        ) from exc
    transport = paramiko.Transport(sock)
    try:
        if prefer:  # ask for the key type known_hosts held, as ssh and pyinfra will
            opts = transport.get_security_options()
            known = [t for t in prefer if t in opts.key_types]
            opts.key_types = known + [t for t in opts.key_types if t not in known]
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise RekeyError(
            f"{where}: fetch host key: SSH key exchange failed: {exc}; fix: is sshd running "
            "on that address and port?"
        ) from exc
    finally:
        transport.close()
    return key


def _names_match(field: str, entry_name: str) -> bool:
    """Does a known_hosts host field (``a,b`` or a hashed ``|1|salt|hash``) name the host?"""
    for name in field.split(","):
        if name.startswith("|1|"):
            if HostKeys.hash_host(entry_name, name) == name:
                return True
        elif name == entry_name:
            return True
    return False


def old_keys(lines: list[str], entry_name: str) -> list[tuple[int, str, str]]:
    """``(line index, key type, fingerprint)`` of each plain entry for ``entry_name``
    (``@cert-authority``/``@revoked`` lines and comments are not host entries)."""
    found = []
    for i, line in enumerate(lines):
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith(("#", "@")):
            continue
        if _names_match(fields[0], entry_name):
            try:
                fp = fingerprint_of_blob(base64.b64decode(fields[2]))
            except ValueError:
                fp = "(unreadable key)"
            found.append((i, fields[1], fp))
    return found


def replaced(lines: list[str], entry_name: str, key: paramiko.PKey) -> list[str]:
    """``lines`` with the host's entries replaced by ``key``; every other line as it was.

    The first entry for the host keeps its host field (its hash) and gets the new key; further
    entries for the host (other key types of the old install) are dropped: the reinstall
    replaced them too. A line that also names other machines (``a,b ssh-ed25519 …``) keeps
    them on the old key: only the host's own name moves to the new line. No entry: one is
    appended, hashed when the file already hashes its names (OpenSSH's HashKnownHosts)."""
    new_key = f"{key.get_name()} {key.get_base64()}"
    matches = [i for i, _t, _fp in old_keys(lines, entry_name)]
    if not matches:
        hashed = any(line.startswith("|1|") for line in lines)
        name = HostKeys.hash_host(entry_name) if hashed else entry_name
        tail = [] if not lines or lines[-1].endswith("\n") else ["\n"]
        return lines + tail + [f"{name} {new_key}\n"]
    out = []
    for i, line in enumerate(lines):
        if i not in matches:
            out.append(line)
            continue
        field, rest = line.split(None, 1)
        names = field.split(",")
        mine = [n for n in names if _names_match(n, entry_name)]
        others = [n for n in names if n not in mine]
        if others:  # the other machines of this line keep their (old) key
            out.append(f"{','.join(others)} {rest}" + ("" if rest.endswith("\n") else "\n"))
        if i == matches[0]:
            out.append(f"{','.join(mine)} {new_key}\n")
    return out


def write_atomic(path: Path, lines: list[str]) -> None:
    """Write ``path`` through a temp file and a rename in its directory, keeping its mode and
    owner: a crash leaves the old file or the new one, never half of it."""
    path = Path(os.path.realpath(path))  # a symlinked known_hosts stays a symlink
    try:
        st = path.stat()
        mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode, owner = 0o644, None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if owner is not None and owner != (os.getuid(), os.getgid()):
            try:
                os.chown(tmp, *owner)
            except PermissionError:
                pass  # not root: the file becomes ours, as any editor would leave it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _ask_tty(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(question).strip().lower() == "yes"


def rekey(
    target: Target,
    *,
    expect: str | None = None,
    yes: bool = False,
    ask: Callable[[str], bool] = _ask_tty,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Fetch, show, and (when vouched for) replace the host's known_hosts entry; exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    expected = normalize_fingerprint(expect) if expect else None
    try:
        lines = target.known_hosts.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        lines = []
    old = old_keys(lines, target.entry_name)
    prefer = tuple(dict.fromkeys(kind for _i, kind, _fp in old))
    key = fetch_key(target, prefer)
    new_fp = fingerprint(key)
    name = f"{target.host} ({target.entry_name})"
    print(f"{name}: known_hosts {target.known_hosts}", file=out)
    for _i, kind, fp in old or [(0, "-", "(no entry)")]:
        print(f"  old: {kind} {fp}", file=out)
    print(f"  new: {key.get_name()} {new_fp}", file=out)
    if [(kind, fp) for _i, kind, fp in old] == [(key.get_name(), new_fp)]:
        print(f"{name}: the known_hosts entry is already this key: nothing to change", file=out)
        return EXIT_OK
    if expected is not None:
        if new_fp != expected:
            print(
                f"{name}: REFUSED: the host presents {new_fp}, you expected {expected}; "
                f"{target.known_hosts} unchanged. Fix: compare with the fingerprint on the "
                "host's console; if they differ, something else answers at that address",
                file=err,
            )
            return EXIT_MISMATCH
    elif yes:
        print(
            f"WARNING: {name}: --yes accepts {new_fp} without comparing it with the host's "
            "console: anyone on the network path could be answering",
            file=err,
        )
    elif not ask(f"Replace {name}'s known_hosts entry with {new_fp}? Type 'yes': "):
        print(
            f"{name}: not confirmed: {target.known_hosts} unchanged. Fix: pass "
            "--expect SHA256:... (from the host's console), or answer 'yes' on a terminal",
            file=err,
        )
        return EXIT_UNCHANGED
    write_atomic(target.known_hosts, replaced(lines, target.entry_name, key))
    print(f"{name}: known_hosts updated to {new_fp}", file=out)
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m p40fleet.rekey",
        description="After an OS reinstall: replace a host's key in the inventory's known_hosts.",
    )
    p.add_argument("inventory", help="pyinfra inventory, e.g. inventories/lab.py")
    p.add_argument("host", help="the host's name in the inventory")
    p.add_argument("--expect", metavar="SHA256:...", help="fingerprint read on the host's console")
    p.add_argument(
        "--yes", action="store_true", help="accept without a fingerprint (warns; not verified)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return rekey(resolve(args.inventory, args.host), expect=args.expect, yes=args.yes)
    except RekeyError as exc:
        print(f"p40fleet.rekey: error: {exc}", file=sys.stderr)
        return EXIT_UNCHANGED
