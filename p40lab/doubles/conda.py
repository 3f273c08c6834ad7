#!/usr/bin/env python3
"""p40lab double of conda @CONDA_VERSION@ (installed by the Miniconda installer double).

Environments are REAL venvs of the host's python3 at PREFIX/envs/NAME (base = PREFIX itself).
Real behaviours reproduced (docs/stack-facts.md §4):
  * `conda create -n NAME python=X.Y.Z -y`: only the host python's exact version "exists"
    (anything else: PackagesNotFoundError, exit 1);
  * the Terms-of-Service check is the `conda-anaconda-tos` plugin (first published January 2025,
    bundled from Miniconda 25.5.1). Built without it (@TOS_PLUGIN@ = no, Miniconda
    py310_24.11.1-0): there is no `tos` subcommand (`invalid choice: 'tos'`, argparse's usage
    line and exit 2, as `--help` too) and `create` checks no ToS. Built with it (yes): on
    Anaconda's default channels (repo.anaconda.com/pkgs/main, pkgs/r) a non-interactive create
    fails with CondaToSNonInteractiveError until `conda tos accept --override-channels --channel
    URL` was run for each of them (or CONDA_PLUGINS_AUTO_ACCEPT_TOS=yes);
    `--override-channels -c conda-forge` avoids that;
  * `env list [--json]`, `env remove -n NAME -y` / `remove -n NAME --all -y`, `run -n NAME CMD`,
    `info [--json|--envs]`, `tos accept|view|--help` (plugin only),
    `config --add/--remove/--set/--show`, `list -n NAME [PKG]`, `--version`.
  * channels are fetched like conda fetches them: `<channel>/<subdir>/repodata.json` for
    linux-64 and noarch (http(s):// or file://; the proxy variables apply). An unreachable
    channel fails the create with conda 24's CondaHTTPError text (HTTP 000 CONNECTION FAILED,
    exit 1; text as in conda/conda issues #13866, #9948), so a host with no route out and no
    mirror channel fails as a real one does; python=X.Y.Z is found only when a channel's
    repodata lists it (and the double can only build the host python's version).
Error messages and exit codes follow conda's. Package solving is not simulated.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

CONDA_VERSION = "@CONDA_VERSION@"
PREFIX = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVS = os.path.join(PREFIX, "envs")
TOS_DIR = os.path.join(PREFIX, "conda-meta", "tos")
CONDARC = os.path.join(PREFIX, ".condarc")
MAIN = "https://repo.anaconda.com/pkgs/main"
R = "https://repo.anaconda.com/pkgs/r"
DEFAULTS = [MAIN, R]
HOST_PY = "@HOST_PYTHON@"  # the host python3's version, fixed by the installer
TOS_PLUGIN = "@TOS_PLUGIN@" == "yes"  # conda-anaconda-tos bundled (Miniconda >= 25.5.1)
# conda's built-in and bundled-plugin commands, in the order its argparse lists them
COMMANDS = (
    "activate clean commands compare config create deactivate env info init install list "
    "notices package content-trust doctor repoquery remove uninstall rename run search update "
    "upgrade"
).split()
USAGE_LINE = "usage: conda [-h] [-v] [--no-plugins] [-V] COMMAND ..."


def out(text=""):
    sys.stdout.write(text + "\n")


def err(text):
    sys.stderr.write(text + "\n")


def channel_url(c):
    c = c.rstrip("/")
    if c in ("defaults",):
        # condarc's default_channels replaces what "defaults" means (a mirror's way)
        return [x.rstrip("/") for x in read_condarc().get("default_channels") or []] or DEFAULTS
    if c in ("main", "r"):
        return [f"https://repo.anaconda.com/pkgs/{c}"]
    if "://" in c:
        return [c]
    return [f"https://conda.anaconda.org/{c}"]


def read_condarc():
    data = {"channels": []}
    key = None
    try:
        with open(CONDARC) as f:
            for raw in f:
                line = raw.rstrip()
                if not line or line.lstrip().startswith("#"):
                    continue
                if line.startswith("  - ") or line.startswith("- "):
                    if key:
                        data.setdefault(key, []).append(line.split("- ", 1)[1].strip())
                elif ":" in line:
                    k, v = line.split(":", 1)
                    key = k.strip()
                    data[key] = v.strip() if v.strip() else []
    except OSError:
        pass
    return data


def write_condarc(data):
    lines = []
    for k, v in data.items():
        if isinstance(v, list):
            if not v:
                continue
            lines.append(f"{k}:")
            lines += [f"  - {x}" for x in v]
        else:
            lines.append(f"{k}: {v}")
    replace_file(CONDARC, ("\n".join(lines) + "\n").encode())


def replace_file(path, data):
    """``path`` made a new file holding ``data``: written to ``path.partial`` beside it and
    renamed over it, as conda's download() does (a write in place would go through every hard
    link of the old file: a lab clone shares the seed's inodes)."""
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, path)


def channels(cli_channels, override):
    chans = []
    for c in cli_channels:
        chans += channel_url(c)
    if not override:
        cfg = read_condarc().get("channels") or ["defaults"]
        for c in cfg:
            chans += channel_url(c)
    seen = []
    for c in chans:
        if c not in seen:
            seen.append(c)
    return seen


def tos_file(url):
    return os.path.join(TOS_DIR, url.replace("://", "_").replace("/", "_") + ".json")


def tos_accepted(url):
    auto = os.environ.get("CONDA_PLUGINS_AUTO_ACCEPT_TOS", "").lower() in ("yes", "true", "1")
    return auto or os.path.exists(tos_file(url))


def env_prefix(name=None, path=None):
    if path:
        return os.path.abspath(path)
    if name in (None, "base", "root"):
        return PREFIX
    return os.path.join(ENVS, name)


def all_envs():
    envs = [PREFIX]
    if os.path.isdir(ENVS):
        envs += [
            os.path.join(ENVS, e)
            for e in sorted(os.listdir(ENVS))
            if os.path.isdir(os.path.join(ENVS, e, "conda-meta"))
        ]
    return envs


def not_found(prefix):
    err(f"\nEnvironmentLocationNotFound: Not a conda environment: {prefix}\n")
    return 1


def parse(argv, flags_with_value):
    opts, rest, i = {}, [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            opts.setdefault(k, []).append(v)
        elif a in flags_with_value and i + 1 < len(argv):
            opts.setdefault(a, []).append(argv[i + 1])
            i += 1
        elif a.startswith("-") and a != "-":
            opts.setdefault(a, []).append(True)
        else:
            rest.append(a)
        i += 1
    return opts, rest


def one(opts, *keys):
    for k in keys:
        if k in opts:
            return opts[k][-1]
    return None


def tos_error(urls):
    lines = [
        "CondaToSNonInteractiveError: Terms of Service have not been accepted for the following "
        "channels. Please accept or remove them before proceeding:"
    ]
    lines += [f"    \u2022 {u}" for u in urls]
    lines += [
        "",
        "To accept a channel's Terms of Service, run the following and replace `CHANNEL` with "
        "the channel name/URL:",
        "    \u2023 conda tos accept --override-channels --channel CHANNEL",
        "",
        "To remove channels with rejected Terms of Service, run the following and replace "
        "`CHANNEL` with the channel name/URL:",
        "    \u2023 conda config --remove channels CHANNEL",
    ]
    err("\n".join(lines))
    return 1


# conda's url_pat (conda/misc.py, CEP 23): md5, or sha256 with an optional "sha256:" prefix
URL_PAT = re.compile(
    r"(?:(?P<url_p>.+)(?:[/\\]))?"
    r"(?P<fn>[^/\\#]+(?:\.tar\.bz2|\.conda))"
    r"(?:#((?P<md5>[0-9a-f]{32})|((sha256:)?(?P<sha256>[0-9a-f]{64}))))?$"
)
EXPLICIT = "@EXPLICIT"


def read_spec_file(path):
    """(explicit?, lines) of a --file: comments and blank lines dropped."""
    try:
        with open(path) as f:
            raw = [line.strip() for line in f]
    except OSError as e:
        err(f"\nCondaFileIOError: '{path}'. {e.strerror}\n")
        return None, None
    lines = [line for line in raw if line and not line.startswith("#")]
    explicit = EXPLICIT in lines
    return explicit, [line for line in lines if line != EXPLICIT]


def checksum_error(url, path, kind, expected, actual):
    """conda's ChecksumMismatchError (conda/exceptions.py), as the fetch prints it."""
    err(
        "\nChecksumMismatchError: Conda detected a mismatch between the expected content and "
        f"downloaded content\nfor url '{url}'.\n  download saved to: {path}\n"
        f"  expected {kind}: {expected}\n  actual {kind}: {actual}\n"
    )
    return 1


def fetch_explicit(lines, quiet):
    """Download and check every package of an explicit file: ([(fn, url, sha256)], None) or
    (None, exit code after conda's error)."""
    parsed = []
    for line in lines:
        m = URL_PAT.match(line)
        if m is None or not m.group("url_p"):
            err(f"\nParseError: Could not parse explicit URL: {line}\n")
            return None, 1
        parsed.append((m.group("fn"), line.split("#", 1)[0], m.group("md5"), m.group("sha256")))
    pkgs = os.path.join(PREFIX, "pkgs")
    os.makedirs(pkgs, exist_ok=True)
    if not quiet:
        out("\nDownloading and Extracting Packages:")
    got = []
    for fn, url, md5, sha256 in parsed:
        target = os.path.join(pkgs, fn)
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                data = resp.read()
        except urllib.error.HTTPError as e:
            return None, http_error(url, e.code, str(e.reason).upper())
        except (OSError, ValueError):
            return None, http_error(url, "000", "CONNECTION FAILED")
        # checked before it replaces the cached file: conda's partial download is removed on a
        # mismatch and the old archive stays
        actual = hashlib.sha256(data).hexdigest()
        if sha256 and actual != sha256:
            return None, checksum_error(url, target, "sha256", sha256, actual)
        if md5 and hashlib.md5(data).hexdigest() != md5:
            return None, checksum_error(url, target, "md5", md5, hashlib.md5(data).hexdigest())
        replace_file(target, data)
        got.append((fn, url, actual))
    return got, None


def subdirs(chans):
    return [f"{c}/{s}" for c in chans for s in ("linux-64", "noarch")]


def http_error(url, code, reason):
    """conda 24's CondaHTTPError for a repodata URL (its odd last line included)."""
    subdir = url.rsplit("/", 1)[0]
    lines = [
        "",
        f"CondaHTTPError: HTTP {code} {reason} for url <{url}>",
        "Elapsed: -",
        "",
        "An HTTP error occurred when trying to retrieve this URL.",
        "HTTP errors are often intermittent, and a simple retry will get you on your way.",
    ]
    if "repo.anaconda.com" in url:
        lines += [
            "",
            "If your current network has https://www.anaconda.com blocked, please file",
            "a support request with your network engineering team.",
            "",
        ]
    lines += [repr(subdir.replace("://", "//", 1)), ""]
    err("\n".join(lines))
    return 1


def fetch_repodata(chans):
    """(python versions the channels list, None) or (None, exit code after conda's error)."""
    versions = set()
    for sub in subdirs(chans):
        url = f"{sub}/repodata.json"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                data = json.loads(resp.read().decode())
        except urllib.error.HTTPError as e:
            return None, http_error(url, e.code, str(e.reason).upper())
        except (OSError, ValueError):
            return None, http_error(url, "000", "CONNECTION FAILED")
        for key in ("packages", "packages.conda"):
            for rec in (data.get(key) or {}).values():
                if rec.get("name") == "python":
                    versions.add(rec.get("version", ""))
    return versions, None


def cmd_create(argv):
    opts, rest = parse(argv, {"-n", "--name", "-p", "--prefix", "-c", "--channel", "--file"})
    name = one(opts, "-n", "--name")
    path = one(opts, "-p", "--prefix")
    if not name and not path:
        err("\nCondaValueError: one of --name or --prefix must be specified\n")
        return 1
    explicit = None
    for spec_file in opts.get("--file", []):
        is_explicit, lines = read_spec_file(spec_file)
        if lines is None:
            return 1
        if is_explicit:
            explicit = (explicit or []) + lines
        else:
            rest = rest + lines
    override = "--override-channels" in opts
    cli_ch = opts.get("-c", []) + opts.get("--channel", [])
    if override and not cli_ch:
        err("\nCondaValueError: --override-channels requires -c/--channel or --use-local\n")
        return 1
    chans = channels(cli_ch, override)
    yes = "-y" in opts or "--yes" in opts
    quiet = "-q" in opts or "--quiet" in opts
    pending = [c for c in chans if TOS_PLUGIN and c in DEFAULTS and not tos_accepted(c)]
    if pending and (yes or not sys.stdin.isatty()):
        return tos_error(pending)
    specs = [s for s in rest]
    py = None
    for s in specs:
        if s.split("=")[0].split("<")[0].split(">")[0] == "python":
            py = s
    prefix = env_prefix(name, path)
    if not quiet:
        out("Channels:")
        for c in cli_ch or read_condarc().get("channels") or ["defaults"]:
            out(f" - {c}")
        out("Platform: linux-64")
    if explicit is not None:
        return create_explicit(explicit, name, path, argv, yes, quiet)
    available, code = fetch_repodata(chans)
    if available is None:
        if not quiet:
            out("Collecting package metadata (repodata.json): failed")
        return code
    if not quiet:
        out("Collecting package metadata (repodata.json): done")
    if py is not None:
        want = py.split("=", 1)[1].lstrip("=") if "=" in py else HOST_PY
        ok = want in (HOST_PY, ".".join(HOST_PY.split(".")[:2]), HOST_PY.split(".")[0]) or (
            want.endswith("*") and HOST_PY.startswith(want.rstrip("*").rstrip("."))
        )
        if not ok or HOST_PY not in available:
            if not quiet:
                out("Solving environment: failed\n")
            lines = [
                "",
                "PackagesNotFoundError: The following packages are not available from current "
                "channels:",
                "",
                f"  - {py}",
                "",
                "Current channels:",
                "",
            ]
            lines += [f"  - {u}" for u in subdirs(chans)]
            lines += [
                "",
                "To search for alternate channels that may provide the conda package you're",
                "looking for, navigate to",
                "",
                "    https://anaconda.org",
                "",
                "and use the search bar at the top of the page.",
                "",
            ]
            err("\n".join(lines))
            return 1
    others = [s for s in specs if s != py]
    if others:
        if not quiet:
            out("Solving environment: failed\n")
        err(
            "\nPackagesNotFoundError: The following packages are not available from current "
            "channels:\n\n" + "\n".join(f"  - {s}" for s in others) + "\n"
        )
        return 1
    if not quiet:
        out("Solving environment: done\n")
    if os.path.exists(prefix):
        if prefix == PREFIX:
            err("\nCondaValueError: The target prefix is the base prefix. Aborting.\n")
            return 1
        if not yes and not sys.stdin.isatty():
            err(f"WARNING: A conda environment already exists at '{prefix}'")
            err("\nCondaSystemExit: Exiting.\n")
            return 1
        out(f"WARNING: A conda environment already exists at '{prefix}'\n")
        out(
            "Remove existing environment?\nThis will remove ALL directories contained within "
            "this specified prefix directory, including any other conda environments.\n"
        )
        shutil.rmtree(prefix)
    if not quiet:
        out("\n## Package Plan ##\n")
        out(f"  environment location: {prefix}\n")
        out("  added / updated specs:")
        for s in specs:
            out(f"    - {s}")
        out("\n")
        out("Preparing transaction: done")
        out("Verifying transaction: done")
        out("Executing transaction: done")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    r = subprocess.run(["/usr/bin/python3", "-m", "venv", prefix], capture_output=True, text=True)
    if r.returncode != 0:
        err(r.stdout + r.stderr)
        err(f"\nCondaError: failed to create environment at {prefix}\n")
        return 1
    os.makedirs(os.path.join(prefix, "conda-meta"), exist_ok=True)
    with open(os.path.join(prefix, "conda-meta", "history"), "a") as f:
        f.write(f"==> create {' '.join(argv)} <==\n# channels: {','.join(chans)}\n")
        f.write(f"+python-{HOST_PY}\n")
    if not quiet:
        env = name or prefix
        out("#\n# To activate this environment, use\n#")
        out(f"#     $ conda activate {env}\n#")
        out("# To deactivate an active environment, use\n#\n#     $ conda deactivate\n")
    return 0


def create_explicit(lines, name, path, argv, yes, quiet):
    """`create --file EXPLICIT`: every file fetched and checked first, then the env."""
    prefix = env_prefix(name, path)
    got, code = fetch_explicit(lines, quiet)
    if got is None:
        return code
    pythons = [fn.rsplit("-", 2)[1] for fn, _, _ in got if fn.rsplit("-", 2)[0] == "python"]
    if pythons != [HOST_PY]:
        err(
            f"\np40lab conda double: the explicit file names python {', '.join(pythons) or 'none'}"
            f"; the double builds envs of the host python {HOST_PY} only\n"
        )
        return 1
    if prefix == PREFIX:
        err("\nCondaValueError: The target prefix is the base prefix. Aborting.\n")
        return 1
    if os.path.exists(prefix):
        if not yes and not sys.stdin.isatty():
            err(f"WARNING: A conda environment already exists at '{prefix}'")
            err("\nCondaSystemExit: Exiting.\n")
            return 1
        shutil.rmtree(prefix)
    if not quiet:
        out("Preparing transaction: done")
        out("Verifying transaction: done")
        out("Executing transaction: done")
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    r = subprocess.run(["/usr/bin/python3", "-m", "venv", prefix], capture_output=True, text=True)
    if r.returncode != 0:
        err(r.stdout + r.stderr)
        err(f"\nCondaError: failed to create environment at {prefix}\n")
        return 1
    meta = os.path.join(prefix, "conda-meta")
    os.makedirs(meta, exist_ok=True)
    with open(os.path.join(meta, "history"), "a") as f:
        f.write(f"==> create {' '.join(argv)} <==\n# explicit\n")
        for fn, url, sha256 in got:
            dist = fn.removesuffix(".conda").removesuffix(".tar.bz2")
            f.write(f"+{dist}\n")
            with open(os.path.join(meta, dist + ".json"), "w") as rec:
                json.dump({"fn": fn, "url": url, "sha256": sha256}, rec)
    return 0


def cmd_remove_env(argv, all_flag_required):
    opts, _ = parse(argv, {"-n", "--name", "-p", "--prefix"})
    name = one(opts, "-n", "--name")
    path = one(opts, "-p", "--prefix")
    if all_flag_required and "--all" not in opts:
        err(
            "\nCondaValueError: no package names supplied,\n"
            '       try "conda remove -h" for more details\n'
        )
        return 1
    prefix = env_prefix(name, path)
    if prefix == PREFIX:
        err(
            "\nCondaEnvironmentError: cannot remove root environment, add -n NAME or -p PREFIX "
            "option\n"
        )
        return 1
    if not os.path.isdir(os.path.join(prefix, "conda-meta")):
        return not_found(prefix)
    yes = "-y" in opts or "--yes" in opts
    out(f"\nRemove all packages in environment {prefix}:\n")
    if not yes and not sys.stdin.isatty():
        err("\nCondaSystemExit: Exiting.\n")
        return 1
    shutil.rmtree(prefix)
    return 0


def cmd_env(argv):
    sub = argv[0] if argv else ""
    if sub == "list":
        return cmd_env_list(argv[1:])
    if sub == "remove":
        return cmd_remove_env(argv[1:], False)
    if sub == "create":
        err("SpecNotFound: environment.yml file not found")
        return 1
    err("usage: conda env [-h] command ...\nconda env: error: argument command: invalid choice")
    return 2


def cmd_env_list(argv):
    envs = all_envs()
    if "--json" in argv:
        out(json.dumps({"envs": envs}, indent=2))
        return 0
    active = os.environ.get("CONDA_PREFIX", PREFIX)
    out("\n# conda environments:\n#")
    for e in envs:
        nm = "base" if e == PREFIX else os.path.basename(e)
        star = "*" if e == active else " "
        out(f"{nm:<25}{star} {e}")
    out("")
    return 0


def cmd_info(argv):
    if "--envs" in argv or "-e" in argv:
        return cmd_env_list([a for a in argv if a == "--json"])
    py = HOST_PY
    info = {
        "conda_version": CONDA_VERSION,
        "conda_build_version": "not installed",
        "python_version": f"{py}.final.0",
        "platform": "linux-64",
        "root_prefix": PREFIX,
        "default_prefix": PREFIX,
        "active_prefix": os.environ.get("CONDA_PREFIX"),
        "envs": all_envs(),
        "envs_dirs": [ENVS, os.path.expanduser("~/.conda/envs")],
        "pkgs_dirs": [os.path.join(PREFIX, "pkgs"), os.path.expanduser("~/.conda/pkgs")],
        "channels": subdirs(channels([], False)),
        "rc_path": CONDARC,
        "sys.prefix": PREFIX,
    }
    if "--json" in argv:
        out(json.dumps(info, indent=2, sort_keys=True))
    else:
        out(f"\n     active environment : {info['active_prefix'] or 'None'}")
        out(f"       conda version : {CONDA_VERSION}")
        out(f"      python version : {info['python_version']}")
        out(f"    base environment : {PREFIX}  (writable)")
        out(f"        channel URLs : {info['channels'][0] if info['channels'] else ''}")
        out("            platform : linux-64\n")
    return 0


def cmd_run(argv):
    name = path = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-n", "--name") and i + 1 < len(argv):
            name = argv[i + 1]
            i += 2
        elif a in ("-p", "--prefix") and i + 1 < len(argv):
            path = argv[i + 1]
            i += 2
        elif a.startswith("--name="):
            name = a.split("=", 1)[1]
            i += 1
        elif a.startswith("--prefix="):
            path = a.split("=", 1)[1]
            i += 1
        elif a in ("--no-capture-output", "--live-stream", "-s", "--cwd") or a.startswith("--"):
            i += 1
        else:
            break
    cmd = argv[i:]
    if not cmd:
        err("\nArgumentError: No command specified\n")
        return 1
    prefix = env_prefix(name, path)
    if not os.path.isdir(os.path.join(prefix, "conda-meta")):
        return not_found(prefix)
    env = dict(os.environ)
    env["PATH"] = os.path.join(prefix, "bin") + os.pathsep + env.get("PATH", "")
    env["CONDA_PREFIX"] = prefix
    env["CONDA_DEFAULT_ENV"] = name or prefix
    env["CONDA_SHLVL"] = "1"
    env.pop("PYTHONHOME", None)
    try:
        return subprocess.run(cmd, env=env).returncode
    except FileNotFoundError:
        err(f"/usr/bin/bash: line 1: {cmd[0]}: command not found")
        return 127


# the double's own help text (the exit code, 0, is what callers rely on)
TOS_USAGE = "usage: conda tos [-h] {accept,reject,view,interactive,clean} ..."


def cmd_tos(argv):
    if argv and argv[0] in ("-h", "--help"):
        out(TOS_USAGE)
        return 0
    sub = argv[0] if argv else "view"
    opts, _ = parse(argv[1:], {"-c", "--channel"})
    chans = opts.get("-c", []) + opts.get("--channel", [])
    urls = []
    for c in chans:
        urls += channel_url(c)
    if "--override-channels" not in opts:
        urls += channels([], False)
    if sub == "accept":
        os.makedirs(TOS_DIR, exist_ok=True)
        for u in urls:
            replace_file(tos_file(u), json.dumps({"channel": u, "tos_accepted": True}).encode())
            out(f"accepted Terms of Service for {u}")
        return 0
    if sub in ("reject", "clean"):
        for u in urls:
            if os.path.exists(tos_file(u)):
                os.unlink(tos_file(u))
            out(f"rejected Terms of Service for {u}")
        return 0
    if sub in ("view", "status", "--json"):
        for u in urls or DEFAULTS:
            st = "accepted" if tos_accepted(u) else "not accepted"
            out(f"{u}: {st}")
        return 0
    err(f"conda tos: error: argument action: invalid choice: '{sub}'")
    return 2


def cmd_config(argv):
    data = read_condarc()
    i = 0
    changed = False
    while i < len(argv):
        a = argv[i]
        if a in ("--add", "--append", "--prepend") and i + 2 < len(argv):
            key, val = argv[i + 1], argv[i + 2]
            lst = (
                [x for x in data.get(key) or [] if x != val]
                if isinstance(data.get(key), list)
                else []
            )
            data[key] = lst + [val] if a == "--append" else [val] + lst
            changed, i = True, i + 3
        elif a == "--remove" and i + 2 < len(argv):
            key, val = argv[i + 1], argv[i + 2]
            lst = data.get(key) if isinstance(data.get(key), list) else []
            if val not in lst:
                err(
                    f"\nCondaKeyError: '{key}': '{val}' is not in the '{key}' key of the config "
                    "file\n"
                )
                return 1
            data[key] = [x for x in lst if x != val]
            changed, i = True, i + 3
        elif a == "--set" and i + 2 < len(argv):
            data[argv[i + 1]] = argv[i + 2]
            changed, i = True, i + 3
        elif a == "--show":
            keys = argv[i + 1 :] or list(data)
            for k in keys:
                v = data.get(k, [] if k == "channels" else None)
                if isinstance(v, list):
                    out(f"{k}:")
                    for x in v or (["defaults"] if k == "channels" else []):
                        out(f"  - {x}")
                else:
                    out(f"{k}: {v}")
            return 0
        else:
            i += 1
    if changed:
        write_condarc(data)
    return 0


def cmd_list(argv):
    opts, rest = parse(argv, {"-n", "--name", "-p", "--prefix"})
    prefix = env_prefix(one(opts, "-n", "--name"), one(opts, "-p", "--prefix"))
    if not os.path.isdir(os.path.join(prefix, "conda-meta")):
        return not_found(prefix)
    pkgs = [("python", HOST_PY, "p40lab_venv", "")]
    r = subprocess.run(
        [os.path.join(prefix, "bin", "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode == 0:
        try:
            pkgs += [
                (p["name"].lower(), p["version"], "pypi_0", "pypi") for p in json.loads(r.stdout)
            ]
        except ValueError:
            pass
    if rest:
        pkgs = [p for p in pkgs if any(x in p[0] for x in rest)]
    if "--json" in opts:
        out(
            json.dumps(
                [
                    {"name": n, "version": v, "build_string": b, "channel": c or "pkgs/main"}
                    for n, v, b, c in pkgs
                ],
                indent=2,
            )
        )
        return 0
    out(f"# packages in environment at {prefix}:\n#")
    out(f"# {'Name':<23}{'Version':<18}{'Build':<18}Channel")
    for n, v, b, c in sorted(pkgs):
        out(f"{n:<25}{v:<18}{b:<18}{c}")
    return 0


USAGE = f"""{USAGE_LINE}

conda is a tool for managing and deploying applications, environments and packages.
"""


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        out(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd in ("-V", "--version"):
        out(f"conda {CONDA_VERSION}")
        return 0
    handlers = {
        "create": cmd_create,
        "env": cmd_env,
        "info": cmd_info,
        "run": cmd_run,
        "tos": cmd_tos,
        "config": cmd_config,
        "list": cmd_list,
        "remove": lambda a: cmd_remove_env(a, True),
        "uninstall": lambda a: cmd_remove_env(a, True),
    }
    if not TOS_PLUGIN:
        del handlers["tos"]  # the subcommand comes with the plugin only
    if cmd not in handlers:
        # argparse: usage line + error on stderr, exit 2 (python 3.10 quotes the choices)
        choices = ", ".join(f"'{c}'" for c in COMMANDS + (["tos"] if TOS_PLUGIN else []))
        err(USAGE_LINE)
        err(f"conda: error: argument COMMAND: invalid choice: '{cmd}' (choose from {choices})")
        return 2
    return handlers[cmd](rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
