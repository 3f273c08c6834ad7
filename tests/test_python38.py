"""Every piece of Python the project runs with a host's system ``python3`` holds to Python 3.8,
Ubuntu 20.04's: parsed as 3.8 always, and run under a real 3.8 interpreter where one is installed
(pyenv's, beside the system python; a skip says so plainly when there is none).

The pieces: ``files/verl_patches.py`` (the patch step runs it, and ``operations/verl.py`` runs its
text with ``python3 -c`` as the ref-change guard) and the verify probe's ``verl-patches``
snippet (``files/verify-probe.sh.j2``: the env's python, else the system ``python3``). The
probe's other snippet runs under the env's python (3.10) only, and is held to 3.8 as well: one
rule for all the probe's Python. A new ``python3 -c``/``python3 -`` in ``operations/`` or
``facts/`` fails here until it is listed.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPLIER = ROOT / "files" / "verl_patches.py"
PROBE = ROOT / "files" / "verify-probe.sh.j2"
FOCAL = (3, 8)
# where operations/ and facts/ run Python with the host's python3, and what text they run
SYSTEM_PYTHON_SITES = {"operations/verl.py": APPLIER}
_HEREDOC = re.compile(r"<<'EOF'\n(.*?)\nEOF\n", re.S)


def probe_snippets() -> dict[str, str]:
    """The probe's heredoc Python, by the section (or variable) it belongs to."""
    text = PROBE.read_text()
    found = {}
    for match in _HEREDOC.finditer(text):
        before = text[: match.start()]
        section = re.findall(r"^section (\S+)", before, re.M)
        name = "PY_SNIPPET" if before.rstrip().endswith("PY_SNIPPET=$(cat") else section[-1]
        found[name] = match.group(1)
    return found


def python38() -> str | None:
    """A real CPython 3.8: python3.8 on PATH, else pyenv's (``pyenv root`` or ~/.pyenv)."""
    roots = [Path.home() / ".pyenv"]
    if os.environ.get("PYENV_ROOT"):
        roots.insert(0, Path(os.environ["PYENV_ROOT"]))
    pyenv = shutil.which("pyenv") or next(
        (str(r / "bin/pyenv") for r in roots if (r / "bin/pyenv").exists()), None
    )
    if pyenv:
        out = subprocess.run([pyenv, "root"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            roots.insert(0, Path(out.stdout.strip()))
    candidates = [shutil.which("python3.8")]
    for root in roots:
        candidates += [str(p) for p in sorted(root.glob("versions/3.8*/bin/python3.8"))]
    for exe in filter(None, candidates):
        ok = subprocess.run(
            [exe, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"], capture_output=True
        )
        if ok.returncode == 0:
            return exe
    return None


@pytest.fixture(scope="module")
def py38() -> str:
    exe = python38()
    if exe is None:
        pytest.skip(
            "no Python 3.8 interpreter here (no python3.8 on PATH, none under pyenv's "
            "versions/3.8*): the 3.8 parse checks ran, the 3.8 runs did not"
        )
    return exe


# --- parsed as 3.8, always ----------------------------------------------------------------------


def test_the_applier_parses_as_python_38():
    ast.parse(APPLIER.read_text(), str(APPLIER), feature_version=FOCAL)


@pytest.mark.parametrize("name", ["PY_SNIPPET", "verl-patches"])
def test_the_probes_python_parses_as_python_38(name):
    snippets = probe_snippets()
    assert name in snippets, sorted(snippets)
    ast.parse(snippets[name], f"{PROBE.name}:{name}", feature_version=FOCAL)


def test_3_8_parse_catches_newer_syntax():
    """The check is real: 3.9+ syntax is refused with feature_version (3, 8)."""
    for newer in (
        "match x:\n    case 1:\n        pass\n",
        "with (open(a) as f, open(b) as g):\n    pass\n",
    ):
        with pytest.raises(SyntaxError):
            ast.parse(newer, feature_version=FOCAL)


def test_every_system_python3_site_is_listed():
    """A ``python3 -c``/``python3 -`` command in operations/ or facts/ must be in the map."""
    found = set()
    for sub in ("operations", "facts"):
        for path in sorted((ROOT / sub).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if re.search(r"\bpython3?(\.\d+)? (-c|-)( |$)", node.value):
                        found.add(str(path.relative_to(ROOT)))
    assert found == set(SYSTEM_PYTHON_SITES), found
    for text in SYSTEM_PYTHON_SITES.values():
        ast.parse(text.read_text(), feature_version=FOCAL)


# --- run under a real 3.8 -----------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.email=a@b", "-c", "user.name=a"]
    return subprocess.run(
        ["git", *ident, "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture()
def checkout(tmp_path) -> Path:
    """A checkout at v1 (verl/a.py), whose v2 adds NEWS.md."""
    repo = tmp_path / "verl"
    (repo / "verl").mkdir(parents=True)
    (repo / "verl" / "a.py").write_text("dtype = 'bfloat16'\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "v1")
    _git(repo, "tag", "v1")
    (repo / "NEWS.md").write_text("v2\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "v2")
    _git(repo, "tag", "v2")
    _git(repo, "checkout", "-q", "v1")
    return repo


def _rules(tmp_path: Path) -> Path:
    rules = tmp_path / "rules.json"
    rule = {"id": "fp16", "file": "verl/a.py", "old": "dtype = 'bfloat16'",
            "new": "dtype = 'float16'", "count": 1, "why": "P40 has no bf16."}  # fmt: skip
    rules.write_text(json.dumps({"format": 1, "ref": "v1", "profile": "pascal",
                                 "supported": True, "reason": "", "rules": [rule]}))  # fmt: skip
    return rules


def test_the_applier_and_its_guard_run_under_python_38(py38, checkout, tmp_path):
    rules = _rules(tmp_path)
    apply = [py38, str(APPLIER), "--rules", str(rules), "--checkout", str(checkout)]
    first = subprocess.run(apply, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (checkout / "verl/a.py").read_text() == "dtype = 'float16'\n"
    again = subprocess.run(apply, capture_output=True, text=True)
    assert again.returncode == 100, again.stdout + again.stderr  # EXIT_NO_CHANGE
    check = subprocess.run([*apply, "--check"], capture_output=True, text=True)
    assert check.returncode == 100, check.stdout + check.stderr
    # the guard as operations/verl.py runs it: the applier's text given to python3 -c
    guard = [py38, "-c", APPLIER.read_text(), "--checkout", str(checkout), "--guard", "v2^{commit}"]
    ok = subprocess.run(guard, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert _git(checkout, "diff", "--name-only") == ""  # our patch restored for the checkout
    # and it refuses the user's edit, naming it
    subprocess.run(apply, check=True, capture_output=True)
    (checkout / "NEWS.md").write_text("mine\n")  # untracked where v2 has a file
    refused = subprocess.run(guard, capture_output=True, text=True)
    assert refused.returncode == 3 and "NEWS.md" in refused.stdout, refused.stdout


def test_the_probes_verl_patches_snippet_runs_under_python_38(py38, checkout, tmp_path):
    patched = checkout / "verl/a.py"
    record = tmp_path / "record.json"
    want = hashlib.sha256(patched.read_bytes()).hexdigest()
    files = {"verl/a.py": want, "verl/gone.py": "0" * 64}
    record.write_text(json.dumps({"ref": "v1", "profile": "pascal", "rule_ids": ["fp16"],
                                  "files": files}))  # fmt: skip
    proc = subprocess.run(
        [py38, "-", str(checkout), str(record)],
        input=probe_snippets()["verl-patches"],
        capture_output=True,
        text=True,
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@json "))
    answer = json.loads(line.removeprefix("@@json "))
    assert "error" not in answer, answer
    assert answer["ref"] == "v1" and answer["rule_ids"] == ["fp16"]
    assert answer["found"] == {"verl/a.py": want, "verl/gone.py": None}
