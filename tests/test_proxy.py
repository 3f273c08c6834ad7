"""``stack.proxy``: the spec model, the one helper (``p40fleet.proxy``), every fetching step's
commands (facts in, commands out) and the password kept out of every text shown."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import StringCommand
from pyinfra.facts.files import File, Sha1File
from pyinfra.facts.server import Which

from p40fleet import proxy
from p40fleet.facts.conda import CondaInstall, CondaState, CondaTos, CondaTosState
from p40fleet.facts.env import EnvPython, EnvPythonState
from p40fleet.facts.host import KernelHeaders, KernelInfo
from p40fleet.facts.mirror import AptSources, AptSourceState, UrlHead
from p40fleet.facts.verl import GitCheckout, GitState
from p40fleet.operations import apex, artifacts, conda, driver, mirror, torch, verl
from p40fleet.operations import proxy as proxy_op
from p40fleet.privdrop import AS_USER_FN
from p40fleet.spec import Proxy, SpecError, load_spec
from p40fleet.spec.proxy import redact
from tests.opharness import at, run_op
from tests.pylayer import ME

# A password that looks like one (and survives percent-decoding the same): never shown.
SECRET = "Zq7-S3cr3t-pw9"
WITH_PW = {"http": f"http://bob:{SECRET}@proxy.lab:3128",
           "https": f"http://bob:{SECRET}@proxy.lab:3128",
           "no_proxy": ["localhost", ".lab.internal"]}  # fmt: skip
PLAIN = {"http": "http://proxy.lab:3128", "https": "http://proxy.lab:3129"}
SOURCE = f". {proxy.PROXY_FILE}"
PY = "/home/verl/miniconda3/envs/verl-p40/bin/python"
PREFIX = "/home/verl/miniconda3"
CONDA_LOCK = str(Path(__file__).resolve().parent.parent / "files" / "conda-env-v0.5.0.txt")


def spec_proxy(data: dict) -> Proxy:
    spec = load_spec("lab1", {"proxy": data})
    assert spec.proxy is not None
    return spec.proxy


# -- the spec --------------------------------------------------------------------------------


def test_no_proxy_by_default():
    assert load_spec("lab1", {}).proxy is None


def test_proxy_variables_lower_and_upper_case():
    p = spec_proxy(WITH_PW)
    assert p.has_secret and not spec_proxy(PLAIN).has_secret
    env = p.variables()
    assert env["http_proxy"] == env["HTTP_PROXY"] == WITH_PW["http"]
    assert env["https_proxy"] == env["HTTPS_PROXY"] == WITH_PW["https"]
    assert env["no_proxy"] == env["NO_PROXY"] == "localhost,.lab.internal"
    assert "no_proxy" not in spec_proxy(PLAIN).variables()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"http": f"http://bob:{SECRET}@proxy.lab"}, "HOST:PORT"),  # no port
        ({"http": f"socks5://bob:{SECRET}@proxy.lab:1080"}, "http://HOST:PORT"),
        ({"http": f"http://bob:{SECRET}@proxy.lab:3128/path"}, "nothing after the port"),
        ({"https": f"http://bob:{SECRET}'x@proxy.lab:3128"}, "percent-encode"),
        ({"http": f"http://:{SECRET}@proxy.lab:3128"}, "a user name"),
        ({"http": "http://proxy.lab:3128", "no_proxy": ["10.0.0.0/8"]}, "no CIDR"),
        ({"http": "http://proxy.lab:3128", "no_proxy": ["*"]}, "no wildcard"),
        ({"no_proxy": ["localhost"]}, "expected a proxy URL in http and/or https"),
    ],
)
def test_bad_proxy_refused_without_showing_the_password(data, words):
    with pytest.raises(SpecError) as info:
        load_spec("lab1", {"proxy": data})
    error = info.value
    shown = str(error) + repr(error.problems) + repr(error.value)
    assert words in shown and "stack.proxy." in shown, shown
    assert SECRET not in shown, shown


def test_repr_and_str_hide_the_password():
    p = spec_proxy(WITH_PW)
    spec = load_spec("lab1", {"proxy": WITH_PW})
    for text in (repr(p), str(p), repr(spec)):
        assert SECRET not in text and "bob:***@proxy.lab:3128" in text


def test_redact():
    assert (
        redact(f"x http://u:{SECRET}@h:1/y and https://h:2")
        == "x http://u:***@h:1/y and https://h:2"
    )
    assert redact({"a": [f"http://u:{SECRET}@h:1"]}) == {"a": ["http://u:***@h:1"]}
    # a user part alone may be a token (https://TOKEN@git.example): hidden whole (N9)
    assert redact("http://u@h:1 https://ghp_T0K3N@git.example/x") == (
        "http://***@h:1 https://***@git.example/x"
    )
    assert redact("https://h/a@b") == "https://h/a@b" and redact(3) == 3
    # a scheme glued to a long word is still a scheme: its password is hidden too
    assert redact("a" * 40 + f"git+https://u:{SECRET}@h/x") == "a" * 40 + "git+https://u:***@h/x"


def test_redact_reads_a_long_text_once():
    """A spec error quotes the value: a 100 kB URL took 2 min to redact (every position of the
    word retried as a scheme's start); now each run of scheme characters is tried once. Here a
    3 MB text (seconds at most now; hours before) and its password still found at the end."""
    text = "https://x/" + "a" * 1_000_000 + " " + "b" * 1_000_000 + f" http://u:{SECRET}@h/"
    assert redact(text).endswith(" http://u:***@h/")


# -- the helper -------------------------------------------------------------------------------


def test_prefix_inline_without_password_sourced_file_with_one():
    assert proxy.shell_prefix(None) == ""
    inline = proxy.shell_prefix(spec_proxy(PLAIN))
    assert "export http_proxy=http://proxy.lab:3128;" in inline
    assert "export HTTPS_PROXY=http://proxy.lab:3129;" in inline
    secret = proxy.shell_prefix(spec_proxy(WITH_PW))
    assert SECRET not in secret and SOURCE in secret


def _sh(script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)


def test_proxied_command_sees_the_variables_and_leaves_them_in_it():
    cmd = proxy.proxied(StringCommand("env"), spec_proxy(PLAIN))
    out = _sh(cmd.get_raw_value() + "; echo after=${http_proxy:-unset}", {"PATH": os.defpath})
    assert "http_proxy=http://proxy.lab:3128" in out.stdout
    assert "https_proxy=http://proxy.lab:3129" in out.stdout
    assert "after=unset" in out.stdout  # a subshell: later commands are not proxied


@pytest.mark.skipif(os.path.exists(proxy.PROXY_FILE), reason="this machine has the file")
def test_proxied_command_fails_naming_the_fix_without_the_credentials_file():
    cmd = proxy.proxied(StringCommand("echo", "fetched"), spec_proxy(WITH_PW))
    out = _sh(cmd.get_raw_value())
    assert out.returncode == 1 and "fetched" not in out.stdout
    assert f"{proxy.PROXY_FILE} (the proxy credentials) is missing" in out.stderr
    assert "run deploy/preflight.py" in out.stderr


def test_credentials_file_text_sources_to_the_exact_values(tmp_path):
    p = spec_proxy(WITH_PW | {"http": "http://b%40b:p%3Aw%2Fx@proxy.lab:3128"})
    env_file = tmp_path / "proxy.env"
    env_file.write_text(proxy.file_text(p))
    out = _sh(f". {env_file}; env", {"PATH": os.defpath})
    seen = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert {k: seen[k] for k in p.variables()} == p.variables()


def test_privdrop_keeps_only_the_proxy_variables_through_env_i():
    script = f"{AS_USER_FN}\np40fleet_as {ME} env"
    env = {"PATH": os.defpath, "http_proxy": "http://p:1", "NO_PROXY": "a,b", "LEAK": "x"}
    seen = _sh(script, env).stdout.splitlines()
    assert "http_proxy=http://p:1" in seen and "NO_PROXY=a,b" in seen
    assert not any(line.startswith(("LEAK=", "https_proxy=")) for line in seen)
    assert not any("proxy" in line.lower() for line in _sh(script, {"PATH": os.defpath}).stdout)


# -- the credentials file ---------------------------------------------------------------------


def test_credentials_written_root_only_and_kept():
    p = spec_proxy(WITH_PW)
    r = run_op(proxy_op.credentials, proxy=p, default_facts=True)
    assert r.uploads[proxy.PROXY_FILE] == proxy.file_text(p)
    # root-only before the secret is written: the dir 0700, the file 0600 before the upload
    assert r.commands[0] == (
        f"install -d -m 700 -o root -g root {proxy.PROXY_DIR} && ( umask 077 && touch "
        f"{proxy.PROXY_FILE} ) && chmod 600 {proxy.PROXY_FILE}"
    )
    assert r.commands.index(f"upload {proxy.PROXY_FILE}") > 0
    assert any("chmod 600" in c for c in r.commands), r.commands
    assert any("chown root:root" in c for c in r.commands), r.commands
    assert not [c for c in r.commands if SECRET in c]
    import hashlib

    same = run_op(
        proxy_op.credentials,
        proxy=p,
        facts={
            at(File, path=proxy.PROXY_FILE): {"user": "root", "group": "root", "mode": 600},
            at(Sha1File, path=proxy.PROXY_FILE): hashlib.sha1(
                proxy.file_text(p).encode()
            ).hexdigest(),
        },
    )
    assert not same.changed


@pytest.mark.parametrize("data", [None, PLAIN])
def test_credentials_removed_when_no_password_is_needed(data):
    p = None if data is None else spec_proxy(data)
    present = {"user": "root", "group": "root", "mode": 600}
    r = run_op(proxy_op.credentials, proxy=p, facts={File: present})
    assert r.commands == [f"rm -f {proxy.PROXY_FILE}"]
    assert not run_op(proxy_op.credentials, proxy=p, facts={File: None}).changed


# -- every fetching step carries the proxy ----------------------------------------------------


def _fetch_steps(p: Proxy | None) -> dict[str, list[str]]:
    """The commands of every step that fetches, for a host where each has work to do."""
    runs = {
        "artifact (curl)": run_op(
            artifacts.artifact,
            item="driver",
            spec=load_spec("lab1", {"proxy": p and _raw(p)}),
            default_facts=True,
        ),  # fmt: skip
        "apt-get update": run_op(
            mirror.mirror,
            url="http://m/apt",
            suite="./",
            trusted=True,
            proxy=p,
            facts={AptSources: AptSourceState()},
            default_facts=True,
        ),  # fmt: skip
        "apt-get install": run_op(
            driver.build_prereqs,
            proxy=p,
            default_facts=True,
            facts={KernelHeaders: KernelInfo("5.4.0-1", None, False), Which: None},
        ),  # fmt: skip
        "conda create": run_op(
            conda.env,
            prefix=PREFIX,
            env_name="verl-p40",
            python_version="3.10.12",
            lock=CONDA_LOCK,
            lock_dest="/var/cache/p40fleet/conda-env-v0.5.0.txt",
            proxy=p,
            user="verl",
            default_facts=True,
            facts={EnvPython: EnvPythonState("missing")},
        ),  # fmt: skip
        "conda tos accept": run_op(
            conda.conda_tos,
            prefix=PREFIX,
            policy="accept",
            proxy=p,
            user="verl",
            facts={
                CondaInstall: CondaState("healthy", "25.5.1"),
                CondaTos: CondaTosState("plugin"),
            },
            default_facts=True,
        ),  # fmt: skip
        "pip torch": run_op(
            torch.torch,
            python=PY,
            version="2.13.0+cpu",
            lock="files/torch-requirements-lab.txt",
            lock_dest="/c/torch.txt",
            fresh_env=True,
            proxy=p,
            user="verl",
            default_facts=True,
        ),  # fmt: skip
        "git clone verl": run_op(
            verl.checkout,
            path="/home/verl/verl",
            remote="http://m/git/verl.git",
            ref="v0.5.0",
            commit="8" * 40,
            proxy=p,
            user="verl",
            facts={GitCheckout: GitState(False)},
        ),  # fmt: skip
        "git fetch verl": run_op(
            verl.checkout,
            path="/home/verl/verl",
            remote="http://m/git/verl.git",
            ref="v0.5.0",
            commit="8" * 40,
            proxy=p,
            user="verl",
            facts={GitCheckout: GitState(True, True, "0" * 40, "http://m/git/verl.git")},
        ),  # fmt: skip
        "pip verl requirements": run_op(
            verl.requirements,
            python=PY,
            src="files/verl-requirements-lab.txt",
            dest="/home/verl/.cache/p40fleet/r.txt",
            env_dir=f"{PREFIX}/envs/verl-p40",
            fresh_env=True,
            proxy=p,
            user="verl",
            default_facts=True,
        ),  # fmt: skip
        "git clone apex": run_op(
            apex.build_wheel,
            python=PY,
            env_dir=PY.rsplit("/bin/", 1)[0],
            remote="http://m/git/apex.git",
            ref="25.09",
            commit="4" * 40,
            key="K",
            cuda_home="/usr/local/cuda-11.8",
            arch_list="6.1",
            max_jobs=1,
            cuda_ext=False,
            proxy=p,
            user="verl",
            facts={},
        ),  # fmt: skip
    }
    tools = {
        "artifact (curl)": "curl -fsSL", "apt-get update": "apt-get update",
        "apt-get install": "apt-get -y", "conda create": "create -n",
        "conda tos accept": "tos accept", "pip torch": "-m pip",
        "git clone verl": "git clone", "git fetch verl": "fetch --quiet",
        "pip verl requirements": "-m pip", "git clone apex": "git clone",
    }  # fmt: skip
    out = {}
    for step, result in runs.items():
        # a streamed step (downloads): the command inside the FunctionCommand
        streamed = [f.args[0].get_raw_value() for f in result.functions
                    if f.function.__name__ == "_stream"]  # fmt: skip
        fetching = [c for c in [*result.commands, *streamed] if tools[step] in c]
        assert fetching, (step, result.commands)
        out[step] = fetching
        shown = " ".join([*result.noops, *result.logs, *result.failures, *result.commands,
                          *streamed, *map(str, result.uploads.values())])  # fmt: skip
        assert SECRET not in shown, step
    return out


def _raw(p: Proxy) -> dict:
    return {"http": p.http, "https": p.https, "no_proxy": list(p.no_proxy)}


def test_every_fetch_sources_the_credentials_file_and_never_carries_the_password():
    for step, commands in _fetch_steps(spec_proxy(WITH_PW)).items():
        for command in commands:
            assert SOURCE in command, (step, command)
            assert command.index(SOURCE) < command.index("su -s") if "su -s" in command else True
            assert SECRET not in command and "Zq7" not in command


def test_every_fetch_exports_a_proxy_without_password():
    for step, commands in _fetch_steps(spec_proxy(PLAIN)).items():
        for command in commands:
            assert "export http_proxy=http://proxy.lab:3128;" in command, (step, command)
            assert "export https_proxy=http://proxy.lab:3129;" in command, (step, command)


def test_without_a_proxy_no_fetch_changes():
    for step, commands in _fetch_steps(None).items():
        for command in commands:
            assert "proxy" not in command, (step, command)


def test_training_user_fetches_run_under_su_with_the_variables_set_outside():
    """Root sources the file (the training user cannot read it); su keeps the environment."""
    commands = _fetch_steps(spec_proxy(WITH_PW))
    for step in ("conda create", "pip torch", "git clone verl", "pip verl requirements"):
        (command,) = commands[step]
        assert command.startswith(f"( if [ -r {proxy.PROXY_FILE} ]"), command
        assert command.index(SOURCE) < command.index("su -s /bin/sh verl -c"), command


def test_mirror_fact_goes_through_the_proxy_and_waits_for_the_file():
    plain = UrlHead().command(url="http://m/a", proxy=proxy.shell_prefix(spec_proxy(PLAIN)))
    assert plain.get_raw_value().startswith("export http_proxy=http://proxy.lab:3128;")
    secret = proxy.shell_prefix(spec_proxy(WITH_PW), proxy.UNCHECKED)
    text = UrlHead().command(url="http://m/a", proxy=secret).get_raw_value()
    assert SECRET not in text and SOURCE in text
    if not os.path.exists(proxy.PROXY_FILE):  # a first run: not asked, the preflight goes on
        out = _sh(text)
        assert out.returncode == 0 and UrlHead().process(out.stdout.splitlines()).status == -1
    from p40fleet.preflight import mirror_refusals

    assert mirror_refusals([("driver", "http://m/a", -1, "not checked")]) == []
    assert UrlHead().command(url="http://m/a").get_raw_value().startswith("if command -v curl")


def test_credentials_step_queued_once_per_host_and_run():
    from pyinfra.api import State

    state = State()
    assert proxy_op.first_time(state, "lab1") and proxy_op.first_time(state, "lab2")
    assert not proxy_op.first_time(state, "lab1")
