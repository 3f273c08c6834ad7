"""Packaging and docs: the wheel holds p40fleet only; every ``docs/*.md`` the code cites exists.

The wheel is built offline from a copy of the checkout (``pip wheel --no-deps
--no-build-isolation``: setuptools comes with the dev extras), so the checkout stays clean.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_SKIP_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache"}
_DOC_REF = re.compile(r"\bdocs/[\w./-]+?\.md\b(?:`{0,2})(?:\s*§\s*(\d+))?")


def _source_files() -> list[Path]:
    """The project's own text files (code, templates, config, docs), not the venv or caches."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name.endswith((".py", ".sh", ".j2", ".toml", ".md", ".txt")) or name in (
                "Makefile",
                "run",
                "systemctl",
                "dkms",
                "update-initramfs",
            ):
                found.append(Path(root, name))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "p40fleet"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*_SKIP_DIRS, "*.egg-info", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--disable-pip-version-check", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("p40fleet-*.whl")
    return whl


def test_wheel_holds_p40fleet_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"p40fleet"}, sorted(top)  # no facts/, operations/, p40lab/
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "p40fleet").rglob("*.py")}
    assert modules <= set(names), sorted(modules - set(names))
    (info,) = dist_info
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "Requires-Dist: pyinfra" in meta


def test_installed_verify_runs_from_the_checkout_and_says_so_elsewhere(wheel, tmp_path):
    """The wheel's ``p40fleet.verify`` (not the checkout's) finds deploy/verify.py in the
    working directory, and outside a checkout exits 2 saying where to run it."""
    env = {**os.environ, "PYTHONPATH": str(wheel)}  # zipimport: before the editable install
    where = (  # in the checkout, but not importing from it ('' on sys.path is the cwd)
        "import os, sys; sys.path.remove(''); os.chdir(sys.argv[1]); "
        "import p40fleet.cli.verify as v; print(v.__file__); print(v.DEPLOY)"
    )
    proc = subprocess.run([sys.executable, "-c", where, str(REPO)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    module, deploy = proc.stdout.split()
    assert module.startswith(str(wheel)), proc.stdout + proc.stderr
    assert deploy == str(REPO / "deploy" / "verify.py")
    (tmp_path / "inventory.py").write_text("hosts = []\n")
    elsewhere = subprocess.run(
        [sys.executable, "-m", "p40fleet.verify", "inventory.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert elsewhere.returncode == 2, elsewhere.stderr
    assert "run this from the p40fleet checkout" in elsewhere.stderr


def test_every_cited_doc_exists():
    cited: dict[str, list[str]] = {}
    for path in _source_files():
        text = path.read_text(errors="replace")
        for m in _DOC_REF.finditer(text):
            doc = m[0].split("`")[0].split("§")[0].strip()
            where = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
            cited.setdefault(doc, []).append(where)
            if m[1] and (REPO / doc).is_file():
                heading = re.compile(rf"^#+\s*{m[1]}\.\s", re.M)
                assert heading.search((REPO / doc).read_text()), f"{where}: {doc} has no §{m[1]}"
    assert "docs/stack-facts.md" in cited  # the check looks where the citations are
    missing = {doc: where for doc, where in cited.items() if not (REPO / doc).is_file()}
    assert not missing, missing


def test_short_citations_name_the_file():
    """``stack-facts §N`` alone does not say where the facts are: cite the path."""
    bare = re.compile(r"(?<![/\w])stack-facts(?!\.md)")
    offenders = [
        f"{p.relative_to(REPO)}:{n}"
        for p in _source_files()
        if p != Path(__file__)
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if bare.search(line)
    ]
    assert not offenders, offenders


def test_setup_compiles_what_a_pyinfra_run_imports(tmp_path):
    """``make setup`` leaves bytecode for the packages pyinfra imports (it writes none itself)."""
    for package in ("facts", "operations", "p40fleet", "p40lab"):
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / package, tmp_path / package, ignore=skip)
    # STAMP= : the venv step is not this test's (it would pip install)
    make = ["make", "-s", "-f", str(REPO / "Makefile"), f"ROOT={tmp_path}", f"PY={sys.executable}",
            "STAMP="]  # fmt: skip
    planned = subprocess.run([*make, "-n", "setup"], capture_output=True, text=True)
    assert "compileall" in planned.stdout, planned.stdout + planned.stderr
    done = subprocess.run([*make, "bytecode"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    sources = sorted(tmp_path.rglob("*.py"))
    assert len(sources) > 50
    stale = []
    for source in sources:
        cached = Path(importlib.util.cache_from_source(str(source)))
        # a pyc header: magic, flags, then the source's mtime and size it was compiled from
        header = cached.read_bytes()[:16] if cached.exists() else b""
        fresh = (
            header[:4] == importlib.util.MAGIC_NUMBER
            and int.from_bytes(header[8:12], "little") == int(source.stat().st_mtime) & 0xFFFFFFFF
        )
        if not fresh:
            stale.append(str(source.relative_to(tmp_path)))
    assert not stale, stale


def test_building_the_package_needs_only_setuptools():
    """``pip install .`` on a controller builds a 100 KB wheel: nothing heavier (pyarrow was a
    build requirement once: 55 MB downloaded for every install)."""
    import tomllib

    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
    assert build["build-backend"] == "setuptools.build_meta"
    assert [re.split(r"[<>=!~ ]", r, maxsplit=1)[0] for r in build["requires"]] == ["setuptools"]


def test_controller_setup_installs_no_lab_package_and_no_dev_tool(tmp_path):
    """``make setup`` (a real controller) runs no apt-get and no dev extras; ``make test`` and
    ``make demo`` set up the lab's packages and the dev tools as well."""
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    make = ["make", "-n", "-f", str(REPO / "Makefile"), f"ROOT={tmp_path}",
            f"VENV={tmp_path}/venv", f"PY={sys.executable}"]  # fmt: skip
    controller = subprocess.run([*make, "setup"], capture_output=True, text=True)
    assert controller.returncode == 0, controller.stderr
    assert "pip install" in controller.stdout, controller.stdout  # the venv's install is planned
    for word in ("apt-get", "dpkg-query", "[dev]", "mmdebstrap"):
        assert word not in controller.stdout, (word, controller.stdout)
    lab = subprocess.run([*make, "lab-setup"], capture_output=True, text=True)
    assert "dpkg-query" in lab.stdout and "[dev]" in lab.stdout, lab.stdout
    for target in ("demo", "test", "lint", "lab-up", "bench"):
        rule = re.search(rf"^{target}: (.*)$", (REPO / "Makefile").read_text(), re.M)
        assert rule and "lab-setup" in rule[1].split(), target


def test_setup_refuses_a_python_older_than_3_10(tmp_path):
    """Ubuntu 20.04's python3 is 3.8: ``make setup`` says so and how to give another one."""
    old = tmp_path / "python3"
    old.write_text("#!/bin/sh\ncase \"$1\" in -V) echo 'Python 3.8.10';; *) exit 1;; esac\n")
    old.chmod(0o755)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    proc = subprocess.run(
        ["make", "-s", "-f", str(REPO / "Makefile"), f"ROOT={tmp_path}", f"VENV={tmp_path}/venv",
         f"PY={tmp_path}/venv/bin/python", f"SYSTEM_PYTHON={old}", "setup"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Python 3.8.10" in proc.stderr and "SYSTEM_PYTHON=" in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()


def test_controller_lock_pins_every_dependency_with_its_hashes():
    """``requirements-controller.txt``: every ``[project]`` dependency pinned to a version its
    range accepts, every line hashed (pip's --require-hashes refuses a line without)."""
    import tomllib
    from packaging.requirements import Requirement

    text = (REPO / "requirements-controller.txt").read_text()
    hashes = r"((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)"
    entries = re.findall(r"^([a-z0-9-]+)==(\S+) \\\n" + hashes, text, re.M)
    body = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(body) == sum(1 + e[2].count("--hash") for e in entries), "an unhashed line"
    pinned = {name: version for name, version, _ in entries}
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in map(Requirement, deps):
        name = re.sub(r"[-_.]+", "-", dep.name).lower()
        assert name in pinned, f"{dep} is not in the controller lock"
        assert dep.specifier.contains(pinned[name]), (str(dep), pinned[name])


def test_a_controller_build_needs_setuptools_only_and_dev_tools_are_pinned():
    """Issue 28: pyarrow as a build dependency made every ``pip install .`` download 55 MB to
    build a pure-Python wheel; an unpinned ruff could fail ``ruff format --check`` unchanged."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert [r.split(">")[0].split("=")[0] for r in project["build-system"]["requires"]] == [
        "setuptools"
    ]
    dev = {
        r.split("=")[0].split(">")[0]: r for r in project["project"]["optional-dependencies"]["dev"]
    }
    assert dev["ruff"].startswith("ruff=="), dev["ruff"]


def test_the_wheel_installs_the_user_folders_under_the_p40fleet_namespace(wheel):
    """facts/, operations/ (with run/ and util/) and files/ go in as p40fleet.facts,
    p40fleet.operations and p40fleet/files; the deploys' steps as p40fleet.deploys.steps."""
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"p40fleet/{dest}/{p.relative_to(REPO / src).as_posix()}"
        for src, dest, pattern in (
            ("facts", "facts", "*.py"),
            ("operations", "operations", "**/*.py"),
            ("files", "files", "*"),
            ("p40fleet/deploys", "deploys", "**/*.py"),
        )
        for p in (REPO / src).glob(pattern)
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert len(expected) > 70  # 77 files today
    assert expected <= names, sorted(expected - names)


def test_another_repo_runs_the_installed_full_deploy(wheel, tmp_path):
    """A deploy file in another repo calls ``p40fleet.deploys.full()`` from the installed
    package (not this checkout): against a GPU-less @local, ``--dry`` names the refusal under
    the deploy's name and changes nothing."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    repo = tmp_path / "their-repo"
    repo.mkdir()
    (repo / "deploy.py").write_text(
        "import sys\n"
        "import p40fleet.deploys, p40fleet.operations.cuda\n"
        "from p40fleet.paths import FILES\n"
        "from p40fleet.deploys import full\n"
        "print('FROM', p40fleet.deploys.__file__, p40fleet.operations.cuda.TEMPLATE, FILES,\n"
        "      file=sys.stderr)\n"
        "full()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}  # before the editable install's finder
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "@local", "deploy.py", "--dry"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    (where,) = [line for line in out.splitlines() if line.startswith("FROM ")][:1]
    module, template, files = where.split()[1:]
    assert module.startswith(str(target)) and template.startswith(str(target)), where
    assert Path(files) == target / "p40fleet" / "files" and Path(template).is_file(), where
    assert "dry run: a real run refuses this host with:" in out, out[-3000:]
    # the layers keep the names local.include gave them, under the deploy's own name
    assert "p40fleet full | deploy/preflight.py | Refuse: preflight" in out, out[-3000:]
    assert "GPUs none: no NVIDIA GPU found" in out, out[-3000:]


def test_the_checkouts_entry_points_keep_their_operation_names(tmp_path):
    """``deploy/full.py`` runs the steps as functions; its operations are still named as when
    it included ``deploy/preflight.py`` (``deploy/preflight.py | …``), and nothing else."""
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "@local", "deploy/full.py", "--dry"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    table = out[out.index("--> Detected changes:") :].splitlines()[2:5]
    names = [line.strip().split("  ")[0] for line in table]
    assert names == [
        "deploy/preflight.py | Take the p40fleet run lock",
        "deploy/preflight.py | Refuse: preflight",
        "deploy/preflight.py | Proxy credentials for the fetching steps",
    ], out[-3000:]


#: The command lines started as ``python -m p40fleet.<name>``: each lives in p40fleet/cli/.
COMMANDS = ("deploy", "rekey", "verify")


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_line_lives_in_cli_and_its_entry_point_only_starts_it(name):
    """``p40fleet/<name>.py`` holds no code of its own: it imports ``main`` from
    ``p40fleet.cli.<name>`` and exits with it; the modules of p40fleet/cli/ are COMMANDS."""
    import ast

    cli = sorted(p.stem for p in (REPO / "p40fleet" / "cli").glob("*.py") if p.stem != "__init__")
    assert cli == list(COMMANDS)
    tree = ast.parse((REPO / "p40fleet" / f"{name}.py").read_text())
    body = [
        n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
    ]
    imports = [n for n in body if isinstance(n, ast.ImportFrom)]
    assert [(n.module, [a.name for a in n.names]) for n in imports] == [
        ("__future__", ["annotations"]), (f"p40fleet.cli.{name}", ["main"]),
    ]  # fmt: skip
    rest = [ast.unparse(n) for n in body if n not in imports]
    assert rest == ["import sys", "if __name__ == '__main__':\n    sys.exit(main())"], rest
