"""verl patch rules against the real verl 0.5.0 source (PyPI sdist), the applier, the remote."""

from __future__ import annotations

import ast
import compileall
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from verl_sdist import cache_dir, extract_verl

from p40fleet import verl_patches as vp
from p40fleet.profile import PROFILES
from p40lab import verl_remote

APPLIER = vp.APPLIER_PATH
ROOT = Path(__file__).resolve().parent.parent
A = vp.load_applier()

# files the rules must never touch (docs/stack-facts.md §5)
UNTOUCHED_GLOBS = ("verl/model_merger/**/*.py", "verl/utils/torch_dtypes.py", "verl/**/megatron*")


@pytest.fixture(scope="session")
def pristine(tmp_path_factory) -> Path:
    return extract_verl(tmp_path_factory.mktemp("sdist") / "verl")


@pytest.fixture()
def checkout(pristine, tmp_path) -> Path:
    dest = tmp_path / "verl"
    shutil.copytree(pristine, dest)
    return dest


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def untouched_files(root: Path) -> list[Path]:
    found = set()
    for pattern in UNTOUCHED_GLOBS:
        for p in root.glob(pattern):
            if p.is_file():
                found.add(p)
            elif p.is_dir():
                found.update(q for q in p.rglob("*") if q.is_file())
    return sorted(found)


def run_cli(checkout: Path, ruleset: dict, tmp_path: Path, *extra: str):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(ruleset))
    return subprocess.run(
        [sys.executable, str(APPLIER), "--rules", str(rules), "--checkout", str(checkout), *extra],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


# --- rules as data ---------------------------------------------------------------------------


def test_every_pascal_rule_matches_its_count_exactly(pristine):
    rs = vp.rule_set("v0.5.0", "pascal")
    assert len(rs.rules) >= 10
    for rule in rs.rules:
        text = (pristine / rule.file).read_text()
        assert text.count(rule.old) == rule.count, rule.id
        assert text.count(rule.new) == 0, rule.id
        assert rule.why.strip().endswith("."), rule.id


def test_rule_sites_cover_stack_facts_files():
    files = {r.file for r in vp.rule_set("v0.5.0", "pascal").rules}
    assert {
        "verl/workers/actor/dp_actor.py",
        "verl/workers/critic/dp_critic.py",
        "verl/workers/fsdp_workers.py",
        "verl/utils/model.py",
    } <= files
    for f in files:
        assert "merger" not in f and "megatron" not in f and not f.endswith("torch_dtypes.py")


def test_profiles_and_refs():
    assert vp.rule_set("v0.5.0", "ampere-plus").rules == ()
    # V100/T4: no bf16, no flash-attn 2 either — the same sites as Pascal need the same rules
    assert vp.rule_set("v0.5.0", "volta-turing").rules == vp.rule_set("v0.5.0", "pascal").rules
    assert vp.rule_set(vp.V050_COMMIT, "pascal").rules == vp.rule_set("v0.5.0", "pascal").rules
    assert vp.rule_set("v0.5.0-lab1", "pascal").ref == "v0.5.0-lab1"
    assert vp.rule_set("v0.5.0", "maxwell").profile == "pascal"
    with pytest.raises(vp.VerlPatchError, match="no rollout backend"):
        vp.rule_set(vp.SEED_COMMIT, "pascal")
    assert vp.rule_set(vp.SEED_COMMIT, "ampere-plus").rules == ()
    with pytest.raises(vp.VerlPatchError, match="no patch rule set"):
        vp.rule_set("v0.4.1", "pascal")
    with pytest.raises(vp.VerlPatchError, match="unknown GPU profile"):
        vp.rule_set("v0.5.0", "kepler")
    for profile in PROFILES:  # every profile p40fleet.profile gives has a rule set
        assert vp.rule_set("v0.5.0", profile).profile == profile
    data = json.loads(vp.ruleset_json("v0.5.0", "pascal"))
    assert data["supported"] is True and data["rules"][0].keys() >= {"id", "old", "new", "count"}


# --- the HF rollout's generation positions (issue 24 section 4) ------------------------------

POSITIONS_RULE = "hf-rollout-generate-positions"
HF_ROLLOUT = "verl/workers/rollout/hf_rollout.py"
POSITIONS_LINE = "                position_ids=position_ids,\n"


def generate_keywords(source: str) -> list[str]:
    """The keyword names of the one ``self.module.generate(...)`` call in ``source``."""
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "generate"
        and ast.unparse(node.func.value) == "self.module"
    ]
    assert len(calls) == 1, len(calls)
    return [kw.arg for kw in calls[0].keywords]


def test_positions_rule_is_in_every_hf_rollout_rule_set():
    """pascal (the P40 and lab rollout, maxwell too) and volta-turing (same set; HF when
    chosen); every name of v0.5.0; never ampere-plus (vLLM computes its own positions)."""
    for ref in ("v0.5.0", vp.V050_COMMIT, "v0.5.0-lab1"):
        for profile in ("pascal", "maxwell", "volta-turing"):
            ids = [r.id for r in vp.rule_set(ref, profile).rules]
            assert ids.count(POSITIONS_RULE) == 1, (ref, profile)
        assert vp.rule_set(ref, "ampere-plus").rules == ()
    data = json.loads(vp.ruleset_json("v0.5.0", "pascal"))
    (rule,) = [r for r in data["rules"] if r["id"] == POSITIONS_RULE]
    assert rule["file"] == HF_ROLLOUT and rule["old"] == POSITIONS_LINE and rule["count"] == 1
    assert "position_ids=" not in rule["new"] and rule["new"].strip().startswith("#")


def test_positions_rule_drops_only_the_generate_argument(checkout):
    before = (checkout / HF_ROLLOUT).read_text()
    assert "position_ids" in generate_keywords(before)  # verl PR #1637, v0.5.0 line 113
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    (rule,) = [r for r in ruleset["rules"] if r["id"] == POSITIONS_RULE]
    A.apply(str(checkout), dict(ruleset, rules=[rule]))
    after = (checkout / HF_ROLLOUT).read_text()
    keywords = generate_keywords(after)
    assert "position_ids" not in keywords
    assert {"input_ids", "attention_mask", "max_new_tokens", "use_cache"} <= set(keywords)
    # that line and nothing else: the response's position ids are still built from the
    # prompt's (v0.5.0 lines 142-153)
    assert after.replace(rule["new"], "") == before.replace(POSITIONS_LINE, "")
    assert 'position_ids = prompts.batch["position_ids"]' in after


@pytest.mark.parametrize("times", [0, 2])
def test_positions_line_not_found_exactly_once_is_refused(checkout, tmp_path, times):
    """A tree where the argument is gone (an upstream change) or doubled: exit 2 naming the
    rule, the file and the counts; no file of the checkout is written."""
    path = checkout / HF_ROLLOUT
    text = path.read_text()
    assert text.count(POSITIONS_LINE) == 1
    path.write_text(text.replace(POSITIONS_LINE, POSITIONS_LINE * times))
    snapshot = tree_hashes(checkout)
    res = run_cli(checkout, vp.rule_set("v0.5.0", "pascal").to_json_dict(), tmp_path)
    assert res.returncode == A.EXIT_MISMATCH, res.stdout
    assert f"rule {POSITIONS_RULE}: {HF_ROLLOUT} (ref v0.5.0, profile pascal)" in res.stdout
    assert f"found old {times}, new 0" in res.stdout and "no file changed" in res.stdout
    assert tree_hashes(checkout) == snapshot


def test_positions_rule_reverts_on_a_profile_change(checkout, pristine):
    vp.apply(checkout, "v0.5.0", "pascal")
    result = vp.apply(checkout, "v0.5.0", "ampere-plus")
    assert (POSITIONS_RULE, "revert") in result["actions"]
    assert (checkout / HF_ROLLOUT).read_bytes() == (pristine / HF_ROLLOUT).read_bytes()


# --- applier ---------------------------------------------------------------------------------


def test_apply_compiles_and_leaves_merger_megatron_dtypes_alone(checkout, tmp_path):
    guarded = untouched_files(checkout)
    assert any("model_merger" in str(p) for p in guarded)
    assert any(p.name == "torch_dtypes.py" for p in guarded)
    assert any("megatron" in str(p) for p in guarded)
    before_all = tree_hashes(checkout)

    res = run_cli(checkout, vp.rule_set("v0.5.0", "pascal").to_json_dict(), tmp_path)
    assert res.returncode == 0, res.stdout
    assert "verl-patch: changed" in res.stdout

    after_all = tree_hashes(checkout)
    changed = {f for f in after_all if before_all.get(f) != after_all[f]}
    rule_files = {r.file for r in vp.rule_set("v0.5.0", "pascal").rules}
    assert changed == rule_files | {vp.RECORD_NAME}
    for p in guarded:
        rel = str(p.relative_to(checkout))
        assert after_all[rel] == before_all[rel], rel
    assert compileall.compile_dir(str(checkout / "verl"), quiet=1, force=True)

    record = json.loads((checkout / vp.RECORD_NAME).read_text())
    assert record["ref"] == "v0.5.0" and record["profile"] == "pascal"
    assert record["rule_ids"] == [r.id for r in vp.rule_set("v0.5.0", "pascal").rules]
    for rel, digest in record["files"].items():
        assert hashlib.sha256((checkout / rel).read_bytes()).hexdigest() == digest
    actor = (checkout / "verl/workers/actor/dp_actor.py").read_text()
    assert "dtype=torch.bfloat16" not in actor


def test_apply_twice_is_no_change(checkout, tmp_path):
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    assert run_cli(checkout, ruleset, tmp_path).returncode == 0
    snapshot = tree_hashes(checkout)
    res = run_cli(checkout, ruleset, tmp_path)
    assert res.returncode == A.EXIT_NO_CHANGE, res.stdout
    assert "verl-patch: no change" in res.stdout
    assert tree_hashes(checkout) == snapshot
    assert vp.plan(checkout, "v0.5.0", "pascal")["status"] == "in-sync"


def test_already_patched_tree_without_record_is_recorded_not_rewritten(checkout, tmp_path):
    vp.apply(checkout, "v0.5.0", "pascal")
    (checkout / vp.RECORD_NAME).unlink()
    snapshot = tree_hashes(checkout)
    result = vp.apply(checkout, "v0.5.0", "pascal")
    assert result["writes"] == {} and result["record"] is not None
    assert {a for _, a in result["actions"]} == {"applied"}
    after = tree_hashes(checkout)
    after.pop(vp.RECORD_NAME)
    assert after == snapshot


def test_missing_old_text_errors_and_changes_nothing(checkout, tmp_path):
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    bad = dict(ruleset["rules"][-1], id="bogus-rule", old="not in verl\n", new="nor this\n")
    ruleset["rules"].append(bad)
    snapshot = tree_hashes(checkout)
    res = run_cli(checkout, ruleset, tmp_path)
    assert res.returncode == A.EXIT_MISMATCH
    assert "bogus-rule" in res.stdout and "ref v0.5.0" in res.stdout
    assert "found old 0, new 0" in res.stdout and "no file changed" in res.stdout
    assert tree_hashes(checkout) == snapshot  # earlier (valid) rules were not written either


def test_count_mismatch_is_an_error(checkout):
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    ruleset["rules"][0]["count"] = 2
    snapshot = tree_hashes(checkout)
    with pytest.raises(A.PatchError) as exc:
        A.apply(str(checkout), ruleset)
    assert exc.value.code == A.EXIT_MISMATCH
    assert ruleset["rules"][0]["id"] in str(exc.value) and "2 time(s)" in str(exc.value)
    assert tree_hashes(checkout) == snapshot


def test_local_edit_after_patching_is_reported_and_untouched(checkout, tmp_path):
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    assert run_cli(checkout, ruleset, tmp_path).returncode == 0
    edited = checkout / "verl/utils/model.py"
    edited.write_text(edited.read_text() + "\n# operator's local edit\n")
    snapshot = tree_hashes(checkout)
    res = run_cli(checkout, ruleset, tmp_path)
    assert res.returncode == A.EXIT_LOCAL_EDITS, res.stdout
    assert "local edits" in res.stdout and "verl/utils/model.py" in res.stdout
    assert tree_hashes(checkout) == snapshot
    assert run_cli(checkout, ruleset, tmp_path, "--check").returncode == A.EXIT_LOCAL_EDITS


def test_reset_file_is_reapplied(checkout, pristine, tmp_path):
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    assert run_cli(checkout, ruleset, tmp_path).returncode == 0
    patched = tree_hashes(checkout)
    rel = "verl/workers/fsdp_workers.py"
    shutil.copy2(pristine / rel, checkout / rel)  # what `git checkout -f -- FILE` does
    res = run_cli(checkout, ruleset, tmp_path)
    assert res.returncode == 0, res.stdout
    assert tree_hashes(checkout) == patched


def test_check_mode_writes_nothing(checkout, tmp_path):
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    snapshot = tree_hashes(checkout)
    res = run_cli(checkout, ruleset, tmp_path, "--check")
    assert res.returncode == 0 and "would change" in res.stdout
    assert tree_hashes(checkout) == snapshot


def test_ampere_plus_has_no_rules_and_changes_nothing(checkout, tmp_path):
    snapshot = tree_hashes(checkout)
    res = run_cli(checkout, vp.rule_set("v0.5.0", "ampere-plus").to_json_dict(), tmp_path)
    assert res.returncode == A.EXIT_NO_CHANGE, res.stdout
    assert tree_hashes(checkout) == snapshot


def test_profile_change_reverts_recorded_rules(checkout, pristine, tmp_path):
    assert (
        run_cli(checkout, vp.rule_set("v0.5.0", "pascal").to_json_dict(), tmp_path).returncode == 0
    )
    res = run_cli(checkout, vp.rule_set("v0.5.0", "ampere-plus").to_json_dict(), tmp_path)
    assert res.returncode == 0, res.stdout
    record = json.loads((checkout / vp.RECORD_NAME).read_text())
    after = tree_hashes(checkout)
    after.pop(vp.RECORD_NAME)
    assert record["profile"] == "ampere-plus" and record["rules"] == []
    assert after == tree_hashes(pristine)


def test_unsupported_ref_exit_code(checkout, tmp_path):
    data = vp.RULE_SETS[vp.SEED_COMMIT]["pascal"].to_json_dict()
    res = run_cli(checkout, data, tmp_path)
    assert res.returncode == A.EXIT_UNSUPPORTED
    assert "no rollout backend" in res.stdout


def test_invalid_rule_rejected(checkout):
    ruleset = vp.rule_set("v0.5.0", "pascal").to_json_dict()
    ruleset["rules"][0]["new"] = ruleset["rules"][0]["old"] + " # more"
    with pytest.raises(A.PatchError, match="new text contains the old text"):
        A.plan(str(checkout), ruleset)


def _python38() -> str | None:
    candidates = [shutil.which("python3.8")]
    candidates += [str(p) for p in sorted(Path.home().glob(".pyenv/versions/3.8*/bin/python3.8"))]
    for exe in filter(None, candidates):
        ok = subprocess.run(
            [exe, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if ok.returncode == 0:
            return exe
    return None


def test_applier_runs_on_python38(checkout, tmp_path):
    py38 = _python38()
    if py38 is None:
        pytest.skip("no python3.8 here")
    rules = tmp_path / "rules.json"
    rules.write_text(vp.ruleset_json("v0.5.0", "pascal"))
    cmd = [py38, str(APPLIER), "--rules", str(rules), "--checkout", str(checkout)]
    assert subprocess.run(cmd, stdout=subprocess.PIPE).returncode == 0
    assert subprocess.run(cmd, stdout=subprocess.PIPE).returncode == A.EXIT_NO_CHANGE


# --- the guard before a ref change (--guard) --------------------------------------------------


@pytest.fixture()
def repo(checkout) -> Path:
    """The sdist as a git checkout at tag v1, its upstream's v2 adds NEWS.md (as a ref bump)."""

    def git(*args):
        subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True)

    commit = ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q"]
    git("init", "-q")
    git("add", "-A")
    git(*commit, "-m", "v1")
    git("tag", "v1")
    (checkout / "NEWS.md").write_text("upstream\n")
    git("add", "NEWS.md")
    git(*commit, "-m", "v2")
    git("tag", "v2")
    git("checkout", "-q", "v1")
    return checkout


def guard(co: Path, target: str = "v2^{commit}") -> subprocess.CompletedProcess:
    """The guard as operations/verl.checkout runs it, before moving ``co`` to ``target``."""
    cmd = [sys.executable, str(APPLIER), "--checkout", str(co), "--guard", target]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def modified(co: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(co), "diff", "--name-only"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return sorted(out.split())


def test_guard_passes_our_patches_and_restores_them(repo):
    patched = sorted(vp.apply(repo, "v0.5.0", "pascal")["writes"])
    assert patched and modified(repo) == patched
    proc = guard(repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert modified(repo) == []  # our patches dropped: the checkout to v2 needs no -f


def test_guard_refuses_an_edit_besides_our_patches_and_touches_nothing(repo):
    patched = sorted(vp.apply(repo, "v0.5.0", "pascal")["writes"])
    init = repo / "verl" / "__init__.py"
    init.write_text(init.read_text() + "# mine\n")
    proc = guard(repo)
    assert proc.returncode == A.EXIT_LOCAL_EDITS, proc.stdout + proc.stderr
    assert proc.stdout.strip() == (
        f"verl checkout {repo} has local edits in: verl/__init__.py; commit or save them "
        f"elsewhere, then 'git -C {repo} checkout -- <files>' and re-run"
    )
    assert modified(repo) == sorted([*patched, "verl/__init__.py"])  # nothing restored
    assert init.read_text().endswith("# mine\n")


def test_guard_refuses_an_edit_of_a_patched_file(repo):
    patched = sorted(vp.apply(repo, "v0.5.0", "pascal")["writes"])
    edited = repo / patched[0]
    edited.write_text(edited.read_text() + "# mine\n")
    proc = guard(repo)
    assert proc.returncode == A.EXIT_LOCAL_EDITS
    assert f"has local edits in: {patched[0]};" in proc.stdout
    assert edited.read_text().endswith("# mine\n")


def test_guard_refuses_an_untracked_file_where_the_target_has_one(repo):
    (repo / "NEWS.md").write_text("mine\n")
    proc = guard(repo)
    assert proc.returncode == A.EXIT_LOCAL_EDITS
    assert proc.stdout.strip() == (
        f"verl checkout {repo}: untracked file(s) of yours where v2^{{commit}} has files: "
        "NEWS.md; move them elsewhere and re-run (they are never overwritten)"
    )
    assert (repo / "NEWS.md").read_text() == "mine\n"


def test_the_record_name_is_the_appliers():
    assert vp.RECORD_NAME == A.RECORD_NAME == ".p40fleet-patches.json"
    assert vp.RECORD_NAME not in Path(ROOT / "operations" / "verl.py").read_text()


# --- the lab's verl remote -------------------------------------------------------------------


def test_verl_remote_clone_tags_and_version(tmp_path):
    info = verl_remote.build_verl_remote(tmp_path / "git" / "verl.git", cache_dir())
    assert info["ref"] == "v0.5.0" and info["version"] == "0.5.0"
    assert info["commit"] == verl_remote.EXPECTED_COMMIT  # stable, but not upstream 8fdc4d3f
    assert info["bump_commit"] == verl_remote.EXPECTED_BUMP_COMMIT
    assert (Path(info["remote"]) / "info" / "refs").is_file()  # dumb-HTTP ready

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", info["remote"], str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", "v0.5.0"], check=True)
    head = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], text=True, stdout=subprocess.PIPE
    ).stdout.strip()
    assert head == info["commit"]
    assert (clone / "verl" / "version" / "version").read_text().strip() == "0.5.0"
    assert not (clone / "PKG-INFO").exists()
    # the v0.5.0 rules apply to the clone, and to the bump tag's tree
    assert vp.apply(clone, "v0.5.0", "pascal")["writes"]
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", "-f", "v0.5.0-lab1"], check=True)
    assert (clone / vp.RECORD_NAME).exists()  # the v0.5.0 record: files reset, ref differs
    assert vp.apply(clone, "v0.5.0-lab1", "pascal")["writes"]

    again = verl_remote.build_verl_remote(tmp_path / "git" / "verl.git", cache_dir())
    assert again == info


# --- pinned dependency sets ------------------------------------------------------------------


def _pins(name: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / "files" / name).read_text().splitlines():
        line = line.split(" #", 1)[0].strip() if not line.startswith("#") else ""
        if line and not line.startswith("--"):  # --hash=... options (hash-locked files)
            pkg, _, rest = line.partition("==")
            assert rest, f"{name}: {line!r} is not pinned with =="
            ver = rest.split()[0].rstrip("\\")  # the hashes follow the version
            pins[pkg.split("[", 1)[0].lower()] = ver  # ray[default]==... pins ray
    return pins


@pytest.mark.parametrize("name", ["verl-requirements-v0.5.0.txt", "verl-requirements-lab.txt"])
def test_requirements_pinned_and_keep_torch(name):
    pins = _pins(name)
    for pkg in ("numpy", "ray", "tensordict", "transformers", "omegaconf", "packaging", "pandas"):
        assert pkg in pins, pkg
    movers = {"torch", "vllm", "sglang", "flash-attn", "flash_attn", "torchvision", "triton"}
    assert not movers & set(pins)
    assert pins["tensordict"] == "0.9.1" and pins["numpy"].startswith("1.")


def test_requirements_direct_pins_agree():
    real, lab = _pins("verl-requirements-v0.5.0.txt"), _pins("verl-requirements-lab.txt")
    for pkg in ("numpy", "ray", "tensordict", "transformers", "omegaconf", "hydra-core", "pandas"):
        assert real[pkg] == lab[pkg], pkg
