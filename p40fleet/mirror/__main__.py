"""``python -m p40fleet.mirror build DIR [--inventory INV] [--index-url URL ...] [--base-url URL]
[--conda-upstream URL] [--kernel RELEASE ... | --facts FILE] [--apt-upstream URL]
[--apt-suite S ...] [--apt-component C ...] [--upstream-keyring FILE]] | verify DIR |
serve DIR --bind ADDR:PORT [--access-log FILE]``.

The conda part is every file of the conda env's explicit lock (``files/conda-env-<variant>.txt``),
checked against the lock line's sum, under ``DIR/conda/SUBDIR/FILE``.

The apt part runs when a kernel release is known: ``--kernel`` (the releases ``uname -r`` reports
on the hosts), and/or ``--facts FILE``: ``pyinfra INVENTORY fact server.KernelVersion --json >
FILE``, each inventory host's release (with ``--inventory``, a host the file lacks is named:
its headers are not fetched). It mirrors the deploy's apt packages, ``linux-headers-`` of each
kernel, and their dependencies, republished as a signed repository under ``DIR/apt``. The
upstream is dists-style (``URL/dists/SUITE/...``) or, with ``--apt-suite ./`` (a suite ending in
``/``, as in apt's ``deb URL ./``), a flat repository (``URL/Release``, ``URL/Packages[.gz]``, no
components); the mirror is dists-style either way.

Exit codes as the verify CLI's: 0 done / every file matches, 1 something could not be fetched
or does not match (each named), 2 a usage error or a spec that does not validate.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path

from p40fleet.mirror import apt as apt_repo
from p40fleet.mirror.build import AptPlan, MirrorError, build, merge, needs_for, stack_block
from p40fleet.mirror.manifest import Manifest, verify
from p40fleet.mirror.serve import serve
from p40fleet.paths import REPO
from p40fleet.report import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from p40fleet.spec.errors import SpecError
from p40fleet.spec.load import load_spec
from p40fleet.spec.pins import PYPI_SIMPLE, StackSpec

#: The fact whose ``pyinfra INVENTORY fact NAME --json`` output ``--facts`` reads (``uname -r``,
#: the release deploy/facts.py's "kernel" column shows).
KERNEL_FACT = "server.KernelVersion"


def specs_of(inventory: str | None) -> list[StackSpec]:
    """The validated spec of every inventory host (one spec per distinct set of settings);
    without an inventory, ``inventories/group_data/all.py``'s ``stack``."""
    return fleet_of(inventory)[1]


def fleet_of(inventory: str | None) -> tuple[list[str], list[StackSpec]]:
    """The inventory's host names (none without an inventory) and :func:`specs_of`'s specs."""
    if inventory is None:
        group = REPO / "inventories/group_data/all.py"
        stack = runpy.run_path(str(group)).get("stack", {}) if group.is_file() else {}
        return [], [load_spec("group_data/all.py", stack)]
    from p40fleet.runtime.inventory import load_inventory
    from p40fleet.spec.load import spec_for_host

    path = Path(inventory).resolve()
    if not path.is_file():
        raise SpecError("controller", "--inventory", inventory, "expected an inventory file")
    # as the CLIs run pyinfra: group_data and relative paths from the repo
    hosts = list(load_inventory(str(path), REPO))
    specs = [spec_for_host(host) for host in hosts]
    unique: list[StackSpec] = []
    for spec in specs:
        if spec not in unique:
            unique.append(spec)
    return [host.name for host in hosts], unique


def kernels_from_facts(path: Path) -> dict[str, str]:
    """``{host: release}`` from ``pyinfra INVENTORY fact server.KernelVersion --json`` output
    (``{"server.KernelVersion": {HOST: RELEASE, ...}}``; a host that did not answer is null
    there and left out here). Raises SpecError naming the file and the command that makes it."""
    make = f"make it with: pyinfra INVENTORY fact {KERNEL_FACT} --json > {path}"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise SpecError("controller", "--facts", str(path),
                        f"cannot read it ({exc.strerror})") from None  # fmt: skip
    except ValueError as exc:
        raise SpecError("controller", "--facts", str(path),
                        f"not JSON ({exc}); {make}") from None  # fmt: skip
    facts = data.get(KERNEL_FACT) if isinstance(data, dict) else None
    if not isinstance(facts, dict):
        raise SpecError("controller", "--facts", str(path), f"no {KERNEL_FACT!r} facts; {make}")
    out = {}
    for name, release in facts.items():
        if release is None:
            continue
        if not isinstance(release, str) or not release.strip() or "/" in release:
            what = f"host {name}: {release!r} is not a kernel release; {make}"
            raise SpecError("controller", "--facts", str(path), what)
        out[str(name)] = release.strip()
    return out


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected ADDR:PORT, e.g. 10.0.0.5:8111")
    return host.strip("[]"), int(port)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m p40fleet.mirror", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fetch what the fleet needs into DIR, each file checked")
    b.add_argument("dir", type=Path)
    b.add_argument("--inventory", help="build for this inventory's hosts (their specs)")
    b.add_argument("--index-url", action="append", dest="indexes", metavar="URL",
                   help="PEP 503 index to find locked files on (repeat; default: PyPI, then "
                   "the spec's torch index)")  # fmt: skip
    b.add_argument("--git-base-url", metavar="URL",
                   help="clone the git pins from URL/NAME.git instead of their remote")  # fmt: skip
    b.add_argument("--base-url", default="http://MIRROR:8111",
                   help="where the mirror will be served (for the stack block)")  # fmt: skip
    b.add_argument("--conda-upstream", metavar="URL",
                   help="fetch the conda lock's files from URL/SUBDIR/FILE (a channel with the "
                   "same files) instead of the lock's own URLs")  # fmt: skip
    b.add_argument("--quiet", action="store_true", help="no progress lines")
    a = b.add_argument_group(
        "apt", "the deploy's apt packages and their closure (with --kernel or --facts)"
    )
    a.add_argument("--kernel", action="append", default=[], metavar="RELEASE",
                   help="a kernel release of the hosts (uname -r, e.g. 5.4.0-150-generic): "
                   "mirror linux-headers-RELEASE (repeat; neither this nor --facts: no apt "
                   "part)")  # fmt: skip
    a.add_argument("--facts", type=Path, metavar="FILE",
                   help=f"the hosts' kernel releases: pyinfra INVENTORY fact {KERNEL_FACT} "
                   "--json > FILE (with --inventory: its hosts' releases; combined with "
                   "--kernel)")  # fmt: skip
    a.add_argument(
        "--apt-upstream",
        default=apt_repo.UBUNTU_ARCHIVE,
        metavar="URL",
        help="the repository to fetch from: dists-style, or flat with --apt-suite ./ "
        "(default %(default)s)",
    )
    a.add_argument("--apt-suite", action="append", metavar="SUITE",
                   help="upstream suite (repeat; default: focal, focal-updates, "
                   "focal-security); one ending in / is a flat repository's directory (./: "
                   "URL/Release, URL/Packages); the mirror's suite is the first that is not "
                   f"flat ({apt_repo.FLAT_MIRROR_SUITE} when all are)")  # fmt: skip
    a.add_argument(
        "--apt-component",
        action="append",
        metavar="C",
        help="upstream component of the dists-style suites (repeat; default: main, "
        "universe); refused when every suite is flat",
    )
    a.add_argument("--upstream-keyring", type=Path, metavar="FILE",
                   help="check each upstream InRelease or Release.gpg (flat ones too) with "
                   "gpgv against this keyring "
                   f"(default: {apt_repo.UBUNTU_KEYRING} when it exists and the upstream is "
                   "the Ubuntu archive)")  # fmt: skip
    a.add_argument(
        "--allow-unverified-upstream",
        action="store_true",
        help="accept a plain-http upstream whose Release signature is not checked, and a "
        "flat Release that lists its Packages index with an MD5Sum only, or no sum",
    )
    a.add_argument("--apt-installed", type=Path, metavar="STATUS",
                   help="a host's /var/lib/dpkg/status (as every host has it after the OS "
                   "install): what it lists as installed is not mirrored, nor what only it "
                   "needs; the deploy's own packages always are")  # fmt: skip
    a.add_argument(
        "--apt-refresh",
        action="store_true",
        help="read the upstream indexes again (default: the ones the last build read)",
    )
    v = sub.add_parser("verify", help="check DIR against its manifest (every file hashed)")
    v.add_argument("dir", type=Path)
    s = sub.add_parser("serve", help="serve DIR over HTTP with byte ranges")
    s.add_argument("dir", type=Path)
    s.add_argument("--bind", type=_address, required=True, metavar="ADDR:PORT")
    s.add_argument("--access-log", type=Path)
    return parser


def _build(args: argparse.Namespace) -> int:
    try:
        hosts, specs = fleet_of(args.inventory)
        needs = merge(n for spec in specs
                      for n in needs_for(spec, args.git_base_url, args.conda_upstream))  # fmt: skip
        kernels, unknown = _kernels(args, hosts)
    except SpecError as exc:
        print(f"mirror build: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except MirrorError as exc:
        print(f"mirror build: {exc}", file=sys.stderr)
        return EXIT_USAGE
    indexes = args.indexes or list(dict.fromkeys([PYPI_SIMPLE, *(str(s.torch.index_url)
                                                                 for s in specs)]))  # fmt: skip
    suites = args.apt_suite or apt_repo.FOCAL_SUITES
    if args.apt_component and all(s.endswith("/") for s in suites):
        print(f"mirror build: --apt-component {' '.join(args.apt_component)}: a flat upstream "
              f"(--apt-suite {' '.join(suites)}) has no components; drop --apt-component",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    plan = _apt_plan(args, sorted(kernels))
    if plan is not None and plan.upstream.keyring and not plan.upstream.keyring.is_file():
        print(f"mirror build: --upstream-keyring {plan.upstream.keyring}: no such file",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    started = time.monotonic()
    try:
        result = build(args.dir, needs, indexes=indexes, progress=not args.quiet, apt=plan)
        problems = []
    except MirrorError as exc:
        result, problems = exc.result, str(exc).splitlines()
    manifest = result.manifest if result else Manifest.load(args.dir)
    fetched = result.fetched if result else {}
    print(f"mirror {args.dir}: {len(needs)} pinned items for {len(specs)} spec(s), "
          f"{time.monotonic() - started:.1f} s")  # fmt: skip
    for kind, (files, size) in sorted(manifest.summary().items()):
        got, moved = fetched.get(kind, (0, 0))
        print(f"  {kind:9} {files:5} files {size / 1e6:10.1f} MB   fetched now: {got} "
              f"({moved / 1e6:.1f} MB)")  # fmt: skip
    if problems:
        for line in problems:
            print(f"  MISSING {line}", file=sys.stderr)
        print("mirror build: incomplete; fix the above and run it again (what it got is kept)",
              file=sys.stderr)  # fmt: skip
        return EXIT_FAIL
    for release, origins in sorted(kernels.items()):
        print(f"  apt: linux-headers-{release} ({', '.join(origins)})")
    if unknown:
        how = (f"add --kernel RELEASE (uname -r on the host), or --facts FILE from: pyinfra "
               f"{args.inventory or 'INVENTORY'} fact {KERNEL_FACT} --json > FILE")  # fmt: skip
        if plan is None:
            print(f"  apt: not built: no kernel release known for {unknown}, so their "
                  "linux-headers-RELEASE are not fetched (nor the deploy's apt packages): "
                  f"{how}")  # fmt: skip
        else:
            print(f"  apt: no kernel release for {unknown}: their linux-headers are not "
                  f"fetched: {how}")  # fmt: skip
    conda = any(n.kind == "conda" for n in needs)
    block = stack_block(args.base_url, result.apt if result else None, conda=conda)
    if conda and block["conda_channel"].startswith("http://"):
        print("  conda: a plain-http conda_channel needs stack.policy.allow_http_conda_channel: "
              "True (each file is still checked against the lock's sum)")  # fmt: skip
    print('stack["mirror"] = ' + json.dumps(block, indent=4))
    return EXIT_OK


def _kernels(args: argparse.Namespace, hosts: list[str]) -> tuple[dict[str, list[str]], str]:
    """The kernel releases to mirror headers for, each with where it came from (``--kernel``,
    the hosts of ``--facts`` that report it), and the hosts whose release is not known, in
    words ("" when none): every inventory host the ``--facts`` file lacks; with no release at
    all, the inventory's hosts (or "the fleet's hosts" without an inventory)."""
    kernels: dict[str, list[str]] = {release: ["--kernel"] for release in args.kernel}
    reported = kernels_from_facts(args.facts) if args.facts is not None else {}
    if hosts:  # the inventory's hosts only; another inventory's hosts in the file are not ours
        missing = [name for name in hosts if name not in reported]
        reported = {name: release for name, release in reported.items() if name in hosts}
    else:
        missing = []
    for name, release in sorted(reported.items()):
        kernels.setdefault(release, []).append(name)
    if missing and (args.facts is not None or not kernels):
        return kernels, ("host " if len(missing) == 1 else "hosts ") + ", ".join(missing)
    return kernels, "" if kernels else "the fleet's hosts"


def _apt_plan(args: argparse.Namespace, kernels: list[str]) -> AptPlan | None:
    if not kernels:
        return None
    keyring = args.upstream_keyring
    if (keyring is None and args.apt_upstream.rstrip("/") == apt_repo.UBUNTU_ARCHIVE
            and Path(apt_repo.UBUNTU_KEYRING).is_file()):  # fmt: skip
        keyring = Path(apt_repo.UBUNTU_KEYRING)
    upstream = apt_repo.Upstream(
        url=args.apt_upstream.rstrip("/"),
        suites=tuple(args.apt_suite or apt_repo.FOCAL_SUITES),
        components=tuple(args.apt_component or apt_repo.FOCAL_COMPONENTS),
        keyring=keyring,
        allow_unverified=args.allow_unverified_upstream,
    )
    return AptPlan(tuple(apt_repo.deploy_packages(kernels)), upstream, args.apt_refresh,
                   args.base_url, args.apt_installed)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        return _build(args)
    if args.command == "verify":
        try:
            problems, checked = verify(args.dir)
        except ValueError as exc:
            print(f"mirror verify: {exc}", file=sys.stderr)
            return EXIT_USAGE
        for line in problems:
            print(f"FAIL {line}")
        print(f"mirror {args.dir}: {checked} entries, {len(problems)} problem(s)")
        return EXIT_FAIL if problems else EXIT_OK
    bind, port = args.bind
    print(f"serving {args.dir} on http://{bind}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        serve(args.dir, bind, port, access_log=args.access_log)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
