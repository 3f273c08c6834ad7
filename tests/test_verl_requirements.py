"""verl's runtime set: every third-party module verl's PPO path imports is pinned, in both files.

Source of truth: verl 0.5.0's PyPI sdist (``tests/verl_sdist.py``), read with ``ast``; nothing
from it is imported. Starting at the PPO path's modules (``ENTRY_MODULES``), verl-internal
imports are followed transitively; importing ``verl.a.b`` also runs ``verl/__init__.py`` and
``verl/a/__init__.py``, so those are followed too. The rule for which imports count:

- only statements that run when the module is imported: the module body, including ``if``,
  ``try``, ``with``, ``for`` and class bodies; imports inside functions are not followed (the
  PPO path's run-time imports of its own modules are entry modules themselves);
- ``if TYPE_CHECKING:`` bodies never run: skipped;
- OPTIONAL (the module may be missing): inside a ``try`` whose handler catches ImportError,
  ModuleNotFoundError or Exception (and in the handlers), or inside an ``if`` whose test names an
  ``is_*_available`` helper (device or package probes), ``find_spec``, or the environment
  (``os.getenv`` / ``os.environ``: an opt-in switch); a verl module reached only that way makes
  its own imports optional too;
- everything else is REQUIRED, including other ``if`` branches (the conservative reading).

REQUIRED modules must be pinned in both files; OPTIONAL ones must be pinned or named in
``LEFT_OUT`` with the reason (a new optional import fails here until someone decides).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from verl_sdist import cache_dir, extract_verl

from p40fleet import hashlock

ROOT = Path(__file__).resolve().parent.parent
FILES = {
    "v0.5.0": ROOT / "files" / "verl-requirements-v0.5.0.txt",
    "lab": ROOT / "files" / "verl-requirements-lab.txt",
}

#: The PPO path (main_ppo with FSDP workers, the HF rollout and the GSM8K reward).
ENTRY_MODULES = (
    "verl.trainer.main_ppo",
    "verl.trainer.ppo.ray_trainer",
    "verl.workers.fsdp_workers",
    "verl.workers.rollout.hf_rollout",
    "verl.workers.actor.dp_actor",
    "verl.workers.critic.dp_critic",
    "verl.utils.dataset.rl_dataset",
    "verl.utils.reward_score.gsm8k",
)

#: Import name -> distribution, where the two differ (dotted keys for namespace packages).
MODULE_DIST = {
    "hydra": "hydra-core",
    "yaml": "PyYAML",
    "google.protobuf": "protobuf",
    "dateutil": "python-dateutil",
    "attr": "attrs",
    "PIL": "pillow",
}

#: Never in these files: installed first, from its own index, at the spec's pin
#: (operations/torch.py); the files are resolved with it held.
HELD = {"torch"}

#: Optional imports the files leave out on purpose, and why.
LEFT_OUT = {
    "flash_attn": "kernels need sm_80+ and it pins other torch builds; behind `if "
    "is_cuda_available` in dp_actor/dp_critic (made try/except by the Pascal patch rules) and "
    "try/except ImportError in utils/torch_functional; use_remove_padding=False on Pascal",
    "torch_npu": "Ascend NPUs only (`if is_npu_available`)",
    "modelscope": "only with VERL_USE_MODELSCOPE=true (verl/__init__.py)",
    "nvtx": "NVTX ranges for the nsys profiler (try/except ImportError)",
    "hdfs_io": "ByteDance-internal HDFS client (try/except ImportError)",
}

#: verl's install_requires entries that cannot serve the host (none is in v0.5.0's
#: install_requires: they are extras there; listed so a ref that moves them in is handled).
EXCLUDED_DISTS = {"vllm", "sglang", "flash-attn", "liger-kernel"}

_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Found:
    """A third-party top-level module and where the walk first met it."""

    module: str
    optional: bool
    where: str


# ------------------------------------------------------------------------- the walk


def module_file(root: Path, module: str) -> Path | None:
    """``verl/a/b.py`` or ``verl/a/b/__init__.py`` for ``verl.a.b`` (None: not a module)."""
    base = root.joinpath(*module.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _names(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
    return out


def _guard(test: ast.expr) -> str | None:
    """'skip' (TYPE_CHECKING), 'optional' (availability / env probe) or None (required)."""
    names = _names(test)
    if "TYPE_CHECKING" in names:
        return "skip"
    if any(re.fullmatch(r"is_\w+_available", n) for n in names):
        return "optional"
    if names & {"find_spec", "getenv", "environ"}:
        return "optional"
    return None


def _catches_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    for handler in handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for t in types:
            if (t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")) in _IMPORT_ERRORS:
                return True
    return False


def import_time_imports(tree: ast.Module, package: str) -> list[tuple[str, list[str], bool, int]]:
    """``(module, imported names, optional, line)`` for each import that runs at import time."""
    out: list[tuple[str, list[str], bool, int]] = []

    def visit(body: list[ast.stmt], optional: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Import):
                out.extend((a.name, [], optional, stmt.lineno) for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom):
                module = stmt.module or ""
                if stmt.level:
                    parts = package.split(".")[: len(package.split(".")) - (stmt.level - 1)]
                    module = ".".join(parts + ([stmt.module] if stmt.module else []))
                out.append((module, [a.name for a in stmt.names], optional, stmt.lineno))
            elif isinstance(stmt, ast.If):
                kind = _guard(stmt.test)
                if kind != "skip":
                    visit(stmt.body, optional or kind == "optional")
                visit(stmt.orelse, optional or kind == "optional")
            elif isinstance(stmt, ast.Try):
                visit(stmt.body, optional or _catches_import_error(stmt.handlers))
                for handler in stmt.handlers:
                    visit(handler.body, True)
                visit(stmt.orelse, optional)
                visit(stmt.finalbody, optional)
            elif isinstance(stmt, (ast.With, ast.For, ast.While, ast.ClassDef)):
                visit(stmt.body, optional)
            # FunctionDef / AsyncFunctionDef: run later, if at all; not followed

    visit(tree.body, False)
    return out


def ppo_third_party(root: Path) -> dict[str, Found]:
    """Third-party top-level modules the PPO path imports (see the module docstring)."""
    done: dict[str, bool] = {}  # verl module -> walked as optional?
    found: dict[str, Found] = {}
    todo = [(m, False) for m in ENTRY_MODULES]
    while todo:
        module, optional = todo.pop()
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name in done and (not done[name] or optional):
                continue
            path = module_file(root, name)
            if path is None:
                continue
            done[name] = optional
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            with warnings.catch_warnings():  # verl's own invalid escapes in docstrings
                warnings.simplefilter("ignore", SyntaxWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                tree = ast.parse(path.read_text(), str(path))
            for target, names, opt, line in import_time_imports(tree, package):
                opt = opt or optional
                top = target.split(".")[0]
                if top == "verl":
                    todo.append((target, opt))
                    todo += [
                        (f"{target}.{n}", opt) for n in names if module_file(root, f"{target}.{n}")
                    ]
                elif top and top not in sys.stdlib_module_names:
                    key = ".".join(target.split(".")[:2])
                    key = key if key in MODULE_DIST else top
                    seen = found.get(key)
                    if seen is None or (seen.optional and not opt):
                        where = f"{path.relative_to(root)}:{line}"
                        found[key] = Found(key, opt, where)
    return found


# ------------------------------------------------------------------------- the files


def pins(path: Path) -> dict[str, tuple[str, Requirement]]:
    """``{canonical name: (raw line, Requirement)}`` of a requirements file."""
    out: dict[str, tuple[str, Requirement]] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].split(" --hash=", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in out, f"{path.name}: {req.name} listed twice"
        out[name] = (line, req)
    return out


def pinned_version(req: Requirement) -> str | None:
    """The version of an exact ``==`` pin (no wildcard), else None."""
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
        return specs[0].version
    return None


def install_requires(root: Path) -> list[Requirement]:
    """verl's ``install_requires`` list from the sdist's setup.py (a literal list there)."""
    tree = ast.parse((root / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "install_requires" for t in node.targets
        ):
            return [Requirement(s) for s in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no literal install_requires")


def dist_of(module: str) -> str:
    return canonicalize_name(MODULE_DIST.get(module, module))


@pytest.fixture(scope="session")
def verl_src(tmp_path_factory) -> Path:
    return extract_verl(tmp_path_factory.mktemp("verl-src") / "verl")


@pytest.fixture(scope="session")
def ppo(verl_src) -> dict[str, Found]:
    return ppo_third_party(verl_src)


def direct_dists(verl_src: Path, ppo: dict[str, Found]) -> set[str]:
    """install_requires (kept) plus what the PPO path imports itself: same pin in both files."""
    names = {canonicalize_name(r.name) for r in install_requires(verl_src)} - EXCLUDED_DISTS
    return names | ({dist_of(f.module) for f in ppo.values() if not f.optional} - HELD)


# ------------------------------------------------------------------------- tests


def test_walk_finds_the_known_ppo_imports(ppo):
    """The walk itself: the imports docs/stack-facts.md §5 names are found where they are."""
    required = {m for m, f in ppo.items() if not f.optional}
    assert {"torchdata", "datasets", "peft", "accelerate", "codetiming"} <= required
    assert {"torch", "ray", "hydra", "transformers", "tensordict", "omegaconf"} <= required
    assert ppo["torchdata"].where.startswith("verl/trainer/ppo/ray_trainer.py:")
    assert ppo["datasets"].where.startswith("verl/utils/dataset/rl_dataset.py:")
    assert ppo["flash_attn"].optional and ppo["torch_npu"].optional


def test_guards_are_read_as_documented():
    src = (
        "import a\n"
        "try:\n    import b\nexcept ImportError:\n    import c\n"
        "try:\n    import d\nexcept ValueError:\n    pass\n"
        "if is_cuda_available:\n    import e\nelse:\n    import f\n"
        "if TYPE_CHECKING:\n    import g\n"
        "if os.getenv('X'):\n    import h\n"
        "if sys.version_info > (3, 10):\n    import i\n"
        "def fn():\n    import j\n"
        "from . import k\n"
    )
    got = {m: opt for m, _, opt, _ in import_time_imports(ast.parse(src), "verl.pkg")}
    assert got == {
        "a": False, "b": True, "c": True, "d": False, "e": True, "f": True,
        "h": True, "i": False, "verl.pkg": False,
    }  # fmt: skip


@pytest.mark.parametrize("variant", sorted(FILES))
def test_every_ppo_import_is_pinned(variant, ppo):
    have = pins(FILES[variant])
    missing = [
        f"{f.module} (imported at {f.where}) -> add {dist_of(f.module)}=="
        for f in sorted(ppo.values(), key=lambda f: f.module)
        if not f.optional and f.module not in HELD and dist_of(f.module) not in have
    ]
    assert not missing, f"{FILES[variant].name} has no pin for: " + "; ".join(missing)


@pytest.mark.parametrize("variant", sorted(FILES))
def test_optional_imports_are_pinned_or_left_out_on_purpose(variant, ppo):
    have = pins(FILES[variant])
    undecided = [
        f"{f.module} ({f.where})"
        for f in ppo.values()
        if f.optional and dist_of(f.module) not in have and f.module not in {*LEFT_OUT, *HELD}
    ]
    assert not undecided, (
        f"optional imports neither pinned in {FILES[variant].name} nor in LEFT_OUT: {undecided}"
    )
    for module in LEFT_OUT:  # stale entries hide the next decision
        assert module in ppo, f"LEFT_OUT names {module}, which the PPO path no longer imports"


@pytest.mark.parametrize("variant", sorted(FILES))
def test_verl_install_requires_are_pinned_within_verls_bounds(variant, verl_src):
    have = pins(FILES[variant])
    problems = []
    for req in install_requires(verl_src):
        name = canonicalize_name(req.name)
        if name in EXCLUDED_DISTS:
            continue
        if name not in have:
            problems.append(f"{req} is not pinned")
            continue
        line, pin = have[name]
        version = pinned_version(pin)
        if version is None or not req.specifier.contains(version, prereleases=True):
            problems.append(f"{line} does not satisfy verl's {req}")
        if not req.extras <= pin.extras:
            problems.append(f"{line} lacks verl's extras {sorted(req.extras)}")
    assert not problems, f"{FILES[variant].name}: " + "; ".join(problems)


@pytest.mark.parametrize("variant", sorted(FILES))
def test_every_line_is_an_exact_pin(variant):
    bad = [
        line
        for line, req in pins(FILES[variant]).values()
        if pinned_version(req) is None or req.marker is not None or req.url
    ]
    assert not bad, f"{FILES[variant].name}: not pinned with ==: {bad}"
    assert not set(pins(FILES[variant])) & HELD, "torch is held by its own step, not pinned here"
    # these pull other torch builds or need sm_70+/sm_80+ (docs/stack-facts.md §5)
    movers = EXCLUDED_DISTS | {"torchvision", "torchaudio", "triton"}
    assert not set(pins(FILES[variant])) & movers, f"{FILES[variant].name} pins a torch mover"


TORCH_LOCKS = {
    "v0.5.0": ROOT / "files" / "torch-requirements-v0.5.0.txt",
    "lab": ROOT / "files" / "torch-requirements-lab.txt",
}
#: Lines without a published sum (the deploy refuses them until stack.torch.sha256 has one).
NO_PUBLISHED_SUM = {"v0.5.0": {"torchvision", "torchaudio"}, "lab": set()}


@pytest.mark.parametrize("path", [*FILES.values(), *TORCH_LOCKS.values()], ids=lambda p: p.name)
def test_every_requirement_line_carries_its_sha256(path):
    """pip's --require-hashes refuses the whole file when one line has no --hash."""
    lines = hashlock.parse(path.read_text())
    no_sum = {line.name for line in lines if not line.hashes}
    allowed = NO_PUBLISHED_SUM.get(path.stem.removeprefix("torch-requirements-"), set())
    if path in FILES.values():
        allowed = set()
    assert no_sum == allowed, f"{path.name}: lines without --hash=sha256: {sorted(no_sum)}"
    assert all(line.version for line in lines), f"{path.name}: not every line is =="
    text = path.read_text()
    assert text.count("--hash=sha256:") == sum(len(line.hashes) for line in lines)


@pytest.mark.parametrize("variant", sorted(FILES))
def test_torch_lock_holds_the_closure_and_agrees_with_the_verl_file(variant):
    torch_pins = hashlock.pinned(TORCH_LOCKS[variant].read_text())
    verl_pins = hashlock.pinned(FILES[variant].read_text())
    assert {"torch", "sympy", "networkx", "jinja2", "markupsafe", "mpmath"} <= set(torch_pins)
    assert {"filelock", "fsspec", "typing-extensions", "setuptools"} <= set(torch_pins)
    if variant == "v0.5.0":  # the real cu118 stack: triton and the cu11 libraries come too
        assert torch_pins["triton"] == "3.2.0" and torch_pins["sympy"] == "1.13.1"
        assert len([n for n in torch_pins if n.startswith("nvidia-") and n.endswith("-cu11")]) == 11
    shared = set(torch_pins) & set(verl_pins)
    differ = {n: (torch_pins[n], verl_pins[n]) for n in shared if torch_pins[n] != verl_pins[n]}
    assert not differ, f"one env, one version per package: {differ}"


def _ninja(variant: str) -> hashlock.LockLine:
    (line,) = [x for x in hashlock.parse(TORCH_LOCKS[variant].read_text()) if x.name == "ninja"]
    return line


@pytest.mark.parametrize("variant", sorted(TORCH_LOCKS))
def test_torch_lock_carries_ninja_for_the_apex_build(variant):
    """The Apex build (the step after torch's) compiles with the env's ninja, in parallel; a
    lock without it builds serially. Always installed (no opt-in mark), pinned, hashed."""
    line = _ninja(variant)
    assert line.version and line.hashes and not line.opt_in, line
    assert "ninja" not in hashlock.pinned(FILES[variant].read_text())  # installed before apex


#: glibc of the hosts each lock installs on (Ubuntu 20.04: 2.31; the lab's bookworm: 2.36).
GLIBC = {"v0.5.0": ("3.10", 31), "lab": ("3.11", 36)}


@pytest.mark.skipif(os.environ.get("P40FLEET_OFFLINE") == "1", reason="P40FLEET_OFFLINE=1")
@pytest.mark.parametrize("variant", sorted(TORCH_LOCKS))
def test_ninja_lists_pypis_sum_of_every_wheel_its_hosts_can_install(variant):
    """--require-hashes installs only a listed sum: every PyPI wheel of the pinned ninja that
    the target (CPython X.Y, manylinux glibc <= the hosts', x86_64) may pick is listed, and
    nothing else."""
    if not _pypi_reachable():
        pytest.skip("PyPI unreachable")
    from packaging import tags
    from packaging.utils import parse_wheel_filename

    line, (python, glibc) = _ninja(variant), GLIBC[variant]
    # PEP 691's JSON simple index: what pip itself reads (every file, with its sha256)
    accept = {"Accept": "application/vnd.pypi.simple.v1+json"}
    request = urllib.request.Request("https://pypi.org/simple/ninja/", headers=accept)
    with urllib.request.urlopen(request, timeout=30) as response:
        files = json.load(response)["files"]
    version = tuple(int(x) for x in python.split("."))
    plats = [f"manylinux_2_{m}_x86_64" for m in range(glibc, 4, -1)]
    plats += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    interpreter = "cp" + python.replace(".", "")
    supported = {
        *tags.cpython_tags(version, abis=[interpreter], platforms=plats),
        *tags.compatible_tags(version, interpreter=interpreter, platforms=plats),
    }
    wheels = [f for f in files if f["filename"].endswith(".whl") and not f.get("yanked")]
    want = {
        f["hashes"]["sha256"]
        for f in wheels
        if str(parse_wheel_filename(f["filename"])[1]) == line.version
        and parse_wheel_filename(f["filename"])[3] & supported
    }
    assert want and set(line.hashes) == want, (sorted(line.hashes), sorted(want))


def test_direct_pins_agree_between_fleet_and_lab(verl_src, ppo):
    fleet, lab = pins(FILES["v0.5.0"]), pins(FILES["lab"])
    differ = [
        f"{name}: {fleet[name][0]} vs {lab[name][0]}"
        for name in sorted(direct_dists(verl_src, ppo))
        if name in fleet and name in lab and fleet[name][0] != lab[name][0]
    ]
    assert not differ, "the lab must run the fleet's direct pins: " + "; ".join(differ)


# ------------------------------------------------------------------------- closure (PyPI)

#: torch's own requirements that come with it from its index (not pinned in the files).
TORCH_ONLY = re.compile(r"^(jinja2|markupsafe|networkx|sympy|mpmath|setuptools|triton|nvidia-.*)$")


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10):
            return True
    except OSError:
        return False


@pytest.mark.skipif(os.environ.get("P40FLEET_OFFLINE") == "1", reason="P40FLEET_OFFLINE=1")
@pytest.mark.parametrize(
    ("variant", "python", "torch"),
    [("v0.5.0", "3.10", "torch==2.6.0"), ("lab", "3.11", "torch==2.13.0+cpu")],
)
def test_files_are_closed_under_pips_resolution(variant, python, torch, tmp_path):
    """pip resolves each file (torch held) to exactly its pins plus torch's own requirements.

    A dependency missing from a file would be installed unpinned on the host; this catches it.
    """
    if not _pypi_reachable():
        pytest.skip("PyPI unreachable")
    if variant == "lab" and not Path("/opt/wheels").is_dir():
        pytest.skip("no /opt/wheels with the lab's torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [sys.executable, "-m", "pip"]
    wheels = cache_dir() / "sdist-wheels"  # antlr4-python3-runtime 4.9.3 ships only an sdist
    if not list(wheels.glob("antlr4_python3_runtime-4.9.3-*.whl")):
        cmd = [*pip, "wheel", "-q", "--no-deps", "--use-pep517", "-w", str(wheels)]
        subprocess.run([*cmd, "antlr4-python3-runtime==4.9.3"], env=env, check=True)
    glibc = 28 if python == "3.10" else 36
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(glibc, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    report = tmp_path / "report.json"
    cmd = [*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report)]
    cmd += ["--target", str(tmp_path / "target")]  # pip < 23.1 wants it with --platform; unused
    cmd += ["--python-version", python, "--implementation", "cp"]
    cmd += ["--abi", "cp" + python.replace(".", ""), "--only-binary=:all:"]
    cmd += [arg for p in platforms for arg in ("--platform", p)]
    cmd += ["--find-links", str(wheels), "--find-links", "/opt/wheels"]
    # the pins alone: the held torch has no sum here, and hash-checking is all or nothing
    pins_only = tmp_path / FILES[variant].name
    pins_only.write_text("".join(f"{line}\n" for line, _ in pins(FILES[variant]).values()))
    cmd += ["-r", str(pins_only), torch]
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    have = {name: pinned_version(req) for name, (_, req) in pins(FILES[variant]).items()}
    unpinned = sorted(
        f"{n}=={v}"
        for n, v in resolved.items()
        if n not in have and n not in HELD and not TORCH_ONLY.match(n)
    )
    assert not unpinned, f"{FILES[variant].name} misses dependencies pip adds: {unpinned}"
    moved = {n: (have[n], resolved.get(n)) for n in have if resolved.get(n) != have[n]}
    assert not moved, f"pins pip does not keep (pin, resolved): {moved}"
