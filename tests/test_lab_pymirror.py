"""The lab's Python side: wheelhouse / PEP 503 index, the Apex stand-in and its git remote.

No root, no lab: everything runs in temp dirs. The venv with the CPU torch the lab hosts is
built from a wheelhouse (itself the offline-install check) and cached in
``~/.cache/p40fleet-test/`` between runs; the stand-in's C++ build takes about a minute.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from p40lab import wheelhouse
from p40lab.apex_remote import STANDIN_DIR, TAG, build_apex_remote, standin_files

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("P40FLEET_TEST_CACHE", Path.home() / ".cache" / "p40fleet-test"))
TORCH_WHEEL = next(iter(sorted(wheelhouse.TORCH_WHEELS.glob("torch-2.13.0+cpu-*.whl"))), None)
TORCH_SET = [wheelhouse.TORCH_REQUIREMENT, "setuptools", "wheel", "packaging", "ninja"]

needs_torch = pytest.mark.skipif(TORCH_WHEEL is None, reason="no torch 2.13.0+cpu in /opt/wheels")
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")


def clean_env(tmp: Path | None = None, **extra: str) -> dict[str, str]:
    """os.environ without pip configuration (no config files, no PIP_* variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    for key in ("CUDA_HOME", "CUDA_PATH", "APEX_CPP_EXT", "APEX_CUDA_EXT", "PYTHONPATH"):
        env.pop(key, None)
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if tmp is not None:
        env["P40LAB_APEX_BUILD_LOG"] = str(tmp / "apex-builds.log")
    env.update(extra)
    return env


def run(cmd, *, env=None, cwd=None, check=True, timeout=900) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd],
        env=env or clean_env(),
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} -> rc {proc.returncode}\n{proc.stdout[-4000:]}")
    return proc


@contextlib.contextmanager
def cache_lock(name: str):
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def torch_wheelhouse() -> tuple[Path, dict]:
    if TORCH_WHEEL is None:
        pytest.skip("no torch 2.13.0+cpu in /opt/wheels")
    dest = CACHE / "lab-pymirror-wheelhouse"
    with cache_lock("lab-pymirror-wheelhouse"):
        result = wheelhouse.build_wheelhouse(dest, TORCH_SET, base_url="http://mirror.test:8111")
    return dest, result


@pytest.fixture(scope="session")
def torch_venv(torch_wheelhouse) -> Path:
    """A venv with torch 2.13.0+cpu installed from the wheelhouse's index only (no network)."""
    dest, result = torch_wheelhouse
    venv = CACHE / "lab-pymirror-venv"
    py = venv / "bin" / "python"
    key = hashlib.sha256(json.dumps([result["requirements"], sys.version]).encode()).hexdigest()
    marker = venv / ".p40fleet-ready"
    with cache_lock("lab-pymirror-venv"):
        if not (marker.exists() and marker.read_text() == key and py.exists()):
            shutil.rmtree(venv, ignore_errors=True)
            run([sys.executable, "-m", "venv", venv])
            index = (dest / "simple").as_uri()
            run([py, "-m", "pip", "install", "-q", "--index-url", index, *TORCH_SET])
            marker.write_text(key)
    run([py, "-m", "pip", "uninstall", "-y", "-q", "apex"], check=False)
    return py


def standin_copy(tmp_path: Path) -> Path:
    src = tmp_path / "apex-src"
    for rel in standin_files(STANDIN_DIR):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STANDIN_DIR / rel, src / rel)
    return src


def fake_cuda(tmp_path: Path, release: str = "11.8") -> Path:
    cuda = tmp_path / f"cuda-{release}"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.89'\n"
    )
    nvcc.chmod(0o755)
    return cuda


# ---------------------------------------------------------------------------- wheelhouse


def test_tiny_wheelhouse_is_pep503_and_installs_offline(tmp_path):
    dest = tmp_path / "wh"
    res = wheelhouse.build_wheelhouse(dest, ["packaging"], base_url="http://10.231.0.1:8111/")
    assert res["pip_index_url"] == "http://10.231.0.1:8111/simple"
    assert res["pip_find_links"] == "http://10.231.0.1:8111/wheels"
    assert res["torch"] is None and res["cached"] is False
    (whl,) = (dest / "wheels").glob("packaging-*.whl")
    page = (dest / "simple" / "packaging" / "index.html").read_text()
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    assert f'href="../../wheels/{whl.name}#sha256={digest}"' in page
    assert 'href="packaging/"' in (dest / "simple" / "index.html").read_text()

    again = wheelhouse.build_wheelhouse(dest, ["packaging"], base_url="http://10.231.0.1:8111")
    assert again["cached"] is True and again["files"] == res["files"]

    for args in (
        ["--no-index", "--find-links", dest / "wheels"],
        ["--index-url", (dest / "simple").as_uri()],
    ):
        target = tmp_path / f"t{len(args)}"
        run([sys.executable, "-m", "pip", "install", "-q", "--target", target, *args, "packaging"])
        assert list(target.glob("packaging-*.dist-info"))


def test_requirements_file_parsing(tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("pyyaml==6.0.2\n")
    req = tmp_path / "req.txt"
    req.write_text(
        "# pinned\n--index-url http://x/simple\ntensordict==0.9.1  # comment\n\n-r other.txt\n"
    )
    assert wheelhouse.read_requirements(req) == ["tensordict==0.9.1", "pyyaml==6.0.2"]
    assert wheelhouse.normalize("Typing_Extensions") == "typing-extensions"
    torch_line = next(r for r in wheelhouse.default_requirements() if r.startswith("torch=="))
    assert torch_line.startswith("torch==2.13.0+cpu --hash=sha256:")
    assert wheelhouse.line_hashes(torch_line) == [torch_line.rsplit(":", 1)[1]]


def test_the_wheelhouse_takes_ninja_from_the_lab_lock_with_its_sum():
    """The lab's hosts install ninja from the torch lock (the Apex build runs it): the mirror
    fetches that line in hash-checking mode and checks a served file has its sum; no second,
    unpinned ninja is fetched beside it."""
    lock_lines = wheelhouse.read_requirements(wheelhouse.TORCH_LOCK)
    ninja = [r for r in wheelhouse.default_requirements() if re.match(r"ninja\b", r)]
    assert len(ninja) == 1 and ninja[0] in lock_lines, ninja
    assert ninja[0].startswith("ninja==") and wheelhouse.line_hashes(ninja[0])


def test_a_locked_line_no_served_file_matches_stops_the_wheelhouse(tmp_path, monkeypatch):
    """The hosts install with --require-hashes: a mirror without the locked bytes is an error
    at build time, naming the line (the sdist fetch finds nothing with --no-index)."""
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "six-1.17.0-py2.py3-none-any.whl", "w") as zf:
        zf.writestr("six-1.17.0.dist-info/METADATA", "Name: six\nVersion: 1.17.0\n\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    good = wheelhouse.sha256_file(wheels / "six-1.17.0-py2.py3-none-any.whl")
    projects = wheelhouse._serve_hashed(tmp_path, [f"six==1.17.0 --hash=sha256:{good}"])
    assert projects["six"][0]["sha256"] == good
    with pytest.raises(wheelhouse.LabError, match="six==1.17.0"):
        wheelhouse._serve_hashed(tmp_path, [f"six==1.17.0 --hash=sha256:{'0' * 64}"])


def test_setup_py_sdist_builds_in_a_stock_venv(tmp_path):
    """antlr4-python3-runtime 4.9.3 (hydra-core's pin) ships only a setup.py sdist.

    The fallback must build it from a venv that has no ``wheel`` (the legacy ``setup.py
    bdist_wheel`` path fails there with "invalid command 'bdist_wheel'").
    """
    venv = tmp_path / "stock"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv])
    py = venv / "bin" / "python"
    assert run([py, "-c", "import wheel"], check=False).returncode != 0, "venv has wheel"
    req = tmp_path / "req.txt"
    req.write_text("antlr4-python3-runtime==4.9.3\n")
    wheels = tmp_path / "wheels"
    code = (
        "import sys; from pathlib import Path; from p40lab import wheelhouse\n"
        f"p = wheelhouse._wheel_fallback(Path({str(wheels)!r}), Path({str(req)!r}))\n"
        "print(p.stdout, p.stderr); sys.exit(p.returncode)\n"
    )
    env = clean_env(tmp_path, PYTHONPATH=str(REPO), PIP_NO_CACHE_DIR="1")  # really build it
    run([py, "-c", code], env=env)
    assert list(wheels.glob("antlr4_python3_runtime-4.9.3-py3-none-any.whl"))


@needs_torch
def test_torch_wheelhouse_serves_the_lab_torch(torch_wheelhouse, torch_venv):
    dest, res = torch_wheelhouse
    assert res["torch"]["version"] == "2.13.0+cpu"
    assert res["torch"]["filename"] == TORCH_WHEEL.name
    for project in ("torch", "setuptools", "wheel", "ninja", "sympy", "filelock"):
        assert (dest / "simple" / project / "index.html").exists(), project
    out = run([torch_venv, "-c", "import torch; print(torch.__version__, torch.version.cuda)"])
    assert "2.13.0+cpu None" in out.stdout


# ---------------------------------------------------------------------------- apex stand-in


@needs_torch
@needs_cxx
def test_apex_cpp_ext_builds_real_extension(torch_venv, tmp_path):
    src = standin_copy(tmp_path)
    env = clean_env(tmp_path, MAX_JOBS="2", TORCH_CUDA_ARCH_LIST="6.0;6.1")
    cmd = [torch_venv, "-m", "pip", "install", "-v", "--no-cache-dir", "--no-index"]
    cmd += ["--no-build-isolation", "--config-settings", "--build-option=--cpp_ext", "./"]
    run(cmd, env=env, cwd=src)
    try:
        probe = (
            "import json, torch, apex, apex_C\n"
            "ts = [torch.ones(2, 3), torch.arange(4.0)]\n"
            "flat = apex_C.flatten(ts)\n"
            "back = apex_C.unflatten(flat, ts)\n"
            "assert flat.shape == (10,) and all(torch.equal(a, b) for a, b in zip(ts, back))\n"
            "print('INFO=' + json.dumps(apex.BUILD_INFO))\n"
        )
        out = run([torch_venv, "-c", probe], cwd=tmp_path, env=env).stdout
        info = json.loads(re.search(r"^INFO=(.*)$", out, re.M).group(1))
        assert info["version"] == "0.1" and info["cpp_ext"] is True and info["cuda_ext"] is False
        assert info["extensions"] == ["apex_C"]
        assert info["MAX_JOBS"] == "2" and info["TORCH_CUDA_ARCH_LIST"] == "6.0;6.1"
        assert info["torch_version"] == "2.13.0+cpu" and info["torch_cuda"] is None
        lines = (tmp_path / "apex-builds.log").read_text().splitlines()
        assert len(lines) == 1 and "cpp_ext=True" in lines[0] and "MAX_JOBS=2" in lines[0]
    finally:
        run([torch_venv, "-m", "pip", "uninstall", "-y", "-q", "apex"], check=False)


@needs_torch
def test_apex_isolated_build_cannot_see_torch(torch_wheelhouse, torch_venv, tmp_path):
    dest, _ = torch_wheelhouse
    links = tmp_path / "links"
    links.mkdir()
    for project in ("setuptools", "wheel", "packaging"):  # wheel needs packaging
        for whl in (dest / "wheels").glob(f"{project}-*.whl"):
            shutil.copy(whl, links)
    src = standin_copy(tmp_path)
    cmd = [torch_venv, "-m", "pip", "install", "--no-index", "--find-links", links]
    cmd += ["--config-settings", "--build-option=--cpp_ext", "./"]
    proc = run(cmd, env=clean_env(tmp_path), cwd=src, check=False)
    assert proc.returncode != 0
    assert "ModuleNotFoundError: No module named 'torch'" in proc.stdout
    assert not (tmp_path / "apex-builds.log").exists()


@needs_torch
def test_apex_cuda_ext_with_cpu_torch_stops_clearly(torch_venv, tmp_path):
    src = standin_copy(tmp_path)
    env = clean_env(tmp_path, CUDA_HOME=str(fake_cuda(tmp_path, "11.8")))
    cmd = [torch_venv, "-m", "pip", "install", "--no-index", "--no-build-isolation"]
    cmd += ["--config-settings", "--build-option=--cpp_ext"]
    cmd += ["--config-settings", "--build-option=--cuda_ext", "./"]
    proc = run(cmd, env=env, cwd=src, check=False)
    assert proc.returncode != 0
    assert "torch.version.cuda is None" in proc.stdout and "release 11.8" in proc.stdout
    assert not (tmp_path / "apex-builds.log").exists()

    # the env form (APEX_CUDA_EXT=1) with no toolkit anywhere: nvcc not found
    proc = run(
        [torch_venv, "setup.py", "--version"],
        env=clean_env(tmp_path, APEX_CUDA_EXT="1"),
        cwd=src,
        check=False,
    )
    assert proc.returncode != 0 and "nvcc was not found" in proc.stdout


@needs_torch
@pytest.mark.parametrize(
    ("torch_cuda", "expect"),
    [
        ("12.1", "does not match the version used to compile Pytorch binaries"),
        ("11.8", "carries no CUDA sources"),
    ],
)
def test_apex_cuda_version_check(torch_venv, tmp_path, torch_cuda, expect):
    """With a CUDA torch (faked: torch.version.cuda patched) nvcc's release is compared."""
    src = standin_copy(tmp_path)
    code = (
        "import runpy, sys, torch\n"
        f"torch.version.cuda = {torch_cuda!r}\n"
        "sys.argv = ['setup.py', '--cuda_ext', '--version']\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
    )
    env = clean_env(tmp_path, CUDA_HOME=str(fake_cuda(tmp_path, "11.8")))
    proc = run([torch_venv, "-c", code], env=env, cwd=src, check=False)
    assert proc.returncode != 0
    assert expect in proc.stdout
    if torch_cuda == "12.1":
        assert "compiled with Cuda 12.1" in proc.stdout and "release 11.8" in proc.stdout


# ---------------------------------------------------------------------------- apex remote


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_apex_remote_tag_and_dumb_http(tmp_path):
    bare = tmp_path / "mirror" / "git" / "apex.git"
    first = build_apex_remote(bare)
    assert first["ref"] == TAG == "25.09" and first["changed"] is True
    assert re.fullmatch(r"[0-9a-f]{40}", first["commit"])
    again = build_apex_remote(bare, url="http://10.231.0.1:8111/git/apex.git")
    assert again["commit"] == first["commit"] and again["changed"] is False
    assert again["remote"] == "http://10.231.0.1:8111/git/apex.git"
    # reproducible: another repo from the same tree has the same commit id
    assert build_apex_remote(tmp_path / "other.git")["commit"] == first["commit"]
    assert "refs/tags/25.09" in (bare / "info" / "refs").read_text()

    handler = lambda *a: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(tmp_path / "mirror")
    )
    http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/git/apex.git"
        clone = tmp_path / "clone"
        run(["git", "clone", "-q", url, clone])
        run(["git", "-C", clone, "checkout", "-q", TAG])
        head = run(["git", "-C", clone, "rev-parse", "HEAD"]).stdout.strip()
        assert head == first["commit"]
        assert run(["git", "-C", clone, "describe", "--tags"]).stdout.strip() == "25.09"
        assert (clone / "setup.py").exists() and (clone / "csrc" / "flatten_unflatten.cpp").exists()
        assert not list(clone.rglob("__pycache__"))
    finally:
        server.shutdown()
        server.server_close()
