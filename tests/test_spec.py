"""The stack spec: defaults are the real pins, bad values give admin-readable SpecErrors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from p40fleet.profile import summarize_host
from p40fleet.spec import (
    SpecError,
    StackSpec,
    clear_spec_cache,
    cuda_release_of,
    deep_merge,
    load_spec,
    spec_for_host,
)

REPO = Path(__file__).resolve().parent.parent
SHA_A = "a" * 64


def refused(stack: dict, stack_host: dict | None = None, host: str = "lab1") -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(host, stack, stack_host)
    return info.value


# -- defaults -----------------------------------------------------------------------------------


def test_defaults_are_the_stack_facts_pins():
    spec = load_spec("lab1", {})
    assert spec == StackSpec()

    assert spec.driver.version == "525.147.05"
    assert spec.driver.filename == "NVIDIA-Linux-x86_64-525.147.05.run"
    assert spec.driver.url == (
        "https://us.download.nvidia.com/tesla/525.147.05/NVIDIA-Linux-x86_64-525.147.05.run"
    )
    assert spec.driver.sha256 == "435183ea545c7e12e3044d7986da07758a3369befe7ee519eb3b063d4af3fef1"
    assert spec.driver.size is None

    assert spec.cuda.version == "11.8.0"
    assert spec.cuda.filename == "cuda_11.8.0_520.61.05_linux.run"
    assert spec.cuda.url == (
        "https://developer.download.nvidia.com/compute/cuda/11.8.0/local_installers/"
        "cuda_11.8.0_520.61.05_linux.run"
    )
    assert spec.cuda.sha256 == "9223c4af3aebe4a7bbed9abd9b163b03a1b34b855fbc2b4a0d1b706ac09a5a16"
    assert spec.cuda.size == 4336730777

    assert spec.cudnn.version == "8.9.7.29"
    assert spec.cudnn.filename == "cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"
    assert spec.cudnn.url == (
        "https://developer.download.nvidia.com/compute/cudnn/redist/cudnn/linux-x86_64/"
        "cudnn-linux-x86_64-8.9.7.29_cuda11-archive.tar.xz"
    )
    assert spec.cudnn.sha256 == "a3e2509028cecda0117ce5a0f42106346e82e86d390f4bb9475afc976c77402e"
    assert spec.cudnn.size == 860967256

    assert spec.miniconda.version == "py310_24.11.1-0"
    assert spec.miniconda.filename == "Miniconda3-py310_24.11.1-0-Linux-x86_64.sh"
    assert spec.miniconda.url == (
        "https://repo.anaconda.com/miniconda/Miniconda3-py310_24.11.1-0-Linux-x86_64.sh"
    )
    assert (
        spec.miniconda.sha256 == "7a3cdbb78a642b2b6dd0687c9e09824e53330368ab57406e27d88e25c4fe4e40"
    )
    assert spec.miniconda.size is None

    assert spec.python_version == "3.10.12"
    # torchvision/torchaudio are opt-in: no published cp310 sum, verl's text PPO imports neither
    assert (spec.torch.version, spec.torch.torchvision, spec.torch.torchaudio) == (
        "2.6.0+cu118",
        None,
        None,
    )
    assert spec.torch.pins() == {"torch": "2.6.0+cu118"}
    assert spec.torch.index_url == "https://download.pytorch.org/whl/cu118"

    assert spec.apex.remote == "https://github.com/NVIDIA/apex"
    assert spec.apex.ref == "25.09"
    assert spec.apex.commit == "4bdecd06b3c4b2c0a8fb6603829a8f9f05a42b49"
    assert spec.verl.remote == "https://github.com/volcengine/verl"
    assert spec.verl.ref == "v0.5.0"
    assert spec.verl.commit == "8fdc4d3f202f41461f4de9f42a637228e342668b"
    assert spec.verl.version == "0.5.0"

    assert spec.paths.cuda_dir == "/usr/local/cuda-11.8"
    assert spec.paths.cuda_link == "/usr/local/cuda"
    assert spec.paths.cudnn_extract_dir == "/usr/local/src"
    assert spec.paths.artifact_cache == "/var/cache/p40fleet"
    assert (spec.user.name, spec.user.uid, spec.user.home) == ("verl", 2001, "/home/verl")
    assert spec.env.conda_prefix == "/home/verl/miniconda3"
    assert spec.env.name == "verl-p40"
    assert spec.env.verl_checkout == "/home/verl/verl"
    assert spec.env.data_dir == "/home/verl/data"
    assert spec.env.model_dir == "/home/verl/models"
    assert spec.mirror is None
    assert spec.policy.allow_reboot is False
    assert spec.policy.conda_tos == "conda-forge"  # no ToS, no licence limit
    assert tuple(spec.policy.force_reinstall) == ()
    assert spec.policy.allow_gcc_override is False
    assert spec.policy.allow_maxwell is False


def test_spec_is_frozen_and_hashable():
    spec = load_spec("lab1", {})
    with pytest.raises(ValidationError):
        spec.python_version = "3.11.7"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        spec.cuda.sha256 = SHA_A  # type: ignore[misc]
    assert hash(spec) == hash(load_spec("lab1", {}))


# -- derived helpers ----------------------------------------------------------------------------


def test_helpers_without_mirror_use_upstream():
    spec = load_spec("lab1", {})
    assert spec.driver_branch == "525"
    for name in ("driver", "cuda", "cudnn", "miniconda"):
        assert spec.artifact_url(name) == getattr(spec, name).url
    assert spec.git_remote("verl") == "https://github.com/volcengine/verl"
    assert spec.git_remote("apex") == "https://github.com/NVIDIA/apex"
    assert spec.pip_index_args()[:2] == ["--index-url", "https://download.pytorch.org/whl/cu118"]
    with pytest.raises(KeyError):
        spec.artifact_url("nccl")
    with pytest.raises(KeyError):
        spec.git_remote("vllm")


def test_mirror_url_resolution():
    spec = load_spec(
        "lab1",
        {
            "mirror": {
                "artifacts_url": "http://10.231.0.1:8111/artifacts/",  # trailing slash dropped
                "pip_index_url": "http://10.231.0.1:8111/simple",
                "git_base_url": "http://10.231.0.1:8111/git",
            }
        },
    )
    assert spec.artifact_url("cuda") == (
        "http://10.231.0.1:8111/artifacts/cuda_11.8.0_520.61.05_linux.run"
    )
    assert spec.artifact_url("driver").endswith("/artifacts/NVIDIA-Linux-x86_64-525.147.05.run")
    assert spec.git_remote("verl") == "http://10.231.0.1:8111/git/verl.git"
    assert spec.git_remote("apex") == "http://10.231.0.1:8111/git/apex.git"
    # A plain-http mirror must be trusted explicitly, or pip ignores it.
    assert spec.pip_index_args() == [
        "--index-url",
        "http://10.231.0.1:8111/simple",
        "--trusted-host",
        "10.231.0.1",
    ]
    assert spec.pip_deps_args() == spec.pip_index_args()


def test_mirror_parts_fall_back_to_upstream():
    spec = load_spec("lab1", {"mirror": {"pip_find_links": "http://10.231.0.1:8111/wheels"}})
    assert spec.artifact_url("cudnn") == spec.cudnn.url
    assert spec.git_remote("apex") == "https://github.com/NVIDIA/apex"
    assert spec.pip_index_args() == [
        "--no-index",
        "--find-links",
        "http://10.231.0.1:8111/wheels",
        "--trusted-host",
        "10.231.0.1",
    ]
    both = load_spec(
        "lab1",
        {"mirror": {"pip_index_url": "http://m/simple", "pip_find_links": "/srv/wheels/"}},
    )
    assert both.pip_index_args() == [
        "--index-url",
        "http://m/simple",
        "--find-links",
        "/srv/wheels",
        "--trusted-host",
        "m",
    ]


def test_without_a_mirror_torch_comes_from_its_index_and_deps_from_pypi():
    spec = load_spec("lab1", {})
    # the closure's other pins (filelock 4.1.0 ...) are on PyPI only; --require-hashes makes the
    # second index harmless (a file with another sum is refused, whichever index serves it)
    assert spec.pip_index_args() == [
        "--index-url",
        "https://download.pytorch.org/whl/cu118",
        "--extra-index-url",
        "https://pypi.org/simple",
    ]
    assert spec.pip_deps_args() == []


def test_torch_opt_ins_are_pinned_when_the_spec_asks():
    spec = load_spec("lab1", {"torch": {"torchvision": "0.21.0+cu118"}})
    assert spec.torch.pins() == {"torch": "2.6.0+cu118", "torchvision": "0.21.0+cu118"}


def test_torch_sums_from_the_spec():
    spec = load_spec("lab1", {"torch": {"sha256": {"torchvision": "AB" * 32}}})
    assert spec.torch.sha256.given() == {"torchvision": "ab" * 32}
    # a second triton sum (the PyTorch index's file, for a mirror filled from it)
    spec = load_spec("lab1", {"torch": {"sha256": {"triton": "cd" * 32}}})
    assert spec.torch.sha256.given() == {"triton": "cd" * 32}
    assert hash(spec)
    with pytest.raises(SpecError):
        load_spec("lab1", {"torch": {"sha256": {"torchvision": "not-a-sum"}}})
    with pytest.raises(SpecError):
        load_spec("lab1", {"torch": {"sha256": {"numpy": "ab" * 32}}})


def test_driver_branch_follows_version():
    spec = load_spec(
        "lab1",
        {
            "driver": {
                "version": "535.104.05",
                "filename": "d.run",
                "url": "https://example.invalid/d.run",
                "sha256": SHA_A,
            }
        },
    )
    assert spec.driver_branch == "535"


def _artifact(version: str) -> dict:
    """A complete override of an artifact pin (version with its own file and sum)."""
    return {"version": version, "filename": "f.run", "url": "https://example.invalid/f.run",
            "sha256": SHA_A}  # fmt: skip


# -- values derived from the pins, once, on the spec ---------------------------------------------


def test_gpu_summary_follows_the_driver_branch_pin():
    l4 = 0x27B8  # Ada: R525 supports it, R470 does not
    assert load_spec("lab1", {}).gpu_summary([l4]).ok
    r470 = load_spec("lab1", {"driver": _artifact("470.223.02")})
    summary = r470.gpu_summary([l4])
    assert not summary.ok and "driver R470 does not support Ada Lovelace" in summary.refused
    assert summarize_host([l4]).ok  # the bare helper's default branch would have let it pass


def test_gpu_summary_follows_the_maxwell_policy():
    m40 = 0x17FD
    assert not load_spec("lab1", {}).gpu_summary([m40]).ok
    allowed = load_spec("lab1", {"policy": {"allow_maxwell": True}}).gpu_summary([m40] * 2)
    assert allowed.ok and allowed.profile == "pascal"
    assert load_spec("lab1", {}).gpu_summary([0x1B38] * 4).profile == "pascal"


def test_cuda_release_is_the_pins_x_y():
    assert load_spec("lab1", {}).cuda_release == "11.8"
    assert load_spec("lab1", {"cuda": _artifact("12.1.105")}).cuda_release == "12.1"
    assert cuda_release_of("11.8.20220929") == cuda_release_of("11.8.89") == "11.8"


def test_max_gcc_comes_from_the_cuda_release():
    assert load_spec("lab1", {}).max_gcc == 11
    assert load_spec("lab1", {"cuda": _artifact("11.8.1")}).max_gcc == 11


def test_max_gcc_of_an_unknown_cuda_release_is_an_error_not_a_guess():
    spec = load_spec("lab1", {"cuda": _artifact("12.1.0")})
    with pytest.raises(LookupError) as err:
        _ = spec.max_gcc
    text = str(err.value)
    assert "stack.cuda.version = '12.1.0'" in text and "CUDA 12.1" in text
    assert "GCC_MAX in p40fleet/spec/pins.py" in text and "known releases: 11.8" in text


def test_requirements_variant_follows_the_torch_pin_unless_set():
    assert load_spec("lab1", {}).requirements_variant == "v0.5.0"
    cpu = load_spec("lab1", {"torch": {"version": "2.13.0+cpu"}})
    assert not cpu.torch_is_cuda and cpu.requirements_variant == "lab"
    set_ = {"torch": {"version": "2.13.0+cpu"}, "verl": {"requirements": "mine"}}
    assert load_spec("lab1", set_).requirements_variant == "mine"
    for variant in ("v0.5.0", "lab"):  # each default names a lock file that exists
        assert (REPO / "files" / f"verl-requirements-{variant}.txt").is_file()
        assert (REPO / "files" / f"torch-requirements-{variant}.txt").is_file()


def test_cuda_tmp_bytes_is_the_unpack_else_1_1_times_the_file_else_4_5_gb():
    spec = load_spec("lab1", {})
    assert spec.cuda.tmp_bytes() == int(4336730777 * 1.1)
    assert load_spec("lab1", {"cuda": _artifact("11.8.1")}).cuda.tmp_bytes() == 4_500_000_000
    unpack = {"cuda": {"unpack_bytes": 123}}
    assert load_spec("lab1", unpack).cuda.tmp_bytes() == 123


# -- merging and normalisation ------------------------------------------------------------------


def test_deep_merge_does_not_touch_inputs():
    base = {"policy": {"allow_reboot": False, "conda_tos": "accept"}, "python_version": "3.10.12"}
    over = {"policy": {"allow_reboot": True}}
    merged = deep_merge(base, over)
    assert merged == {
        "policy": {"allow_reboot": True, "conda_tos": "accept"},
        "python_version": "3.10.12",
    }
    assert base["policy"]["allow_reboot"] is False
    merged["policy"]["conda_tos"] = "x"
    assert base["policy"]["conda_tos"] == "accept"


def test_stack_host_is_deep_merged_over_stack():
    spec = load_spec(
        "lab1",
        {"policy": {"allow_reboot": False, "conda_tos": "conda-forge"}, "cuda": {"size": 1}},
        {"policy": {"allow_reboot": True}, "cuda": {"sha256": SHA_A.upper()}},
    )
    assert spec.policy.allow_reboot is True
    assert spec.policy.conda_tos == "conda-forge"  # kept from stack
    assert spec.cuda.size == 1  # kept from stack
    assert spec.cuda.sha256 == SHA_A  # normalised to lowercase
    assert spec.cuda.version == "11.8.0"  # default


def test_paths_are_normalised():
    spec = load_spec(
        "lab1", {"paths": {"cuda_dir": "/usr/local//cuda-11.8/", "cuda_link": "/opt/cuda/."}}
    )
    assert spec.paths.cuda_dir == "/usr/local/cuda-11.8"
    assert spec.paths.cuda_link == "/opt/cuda"


def test_env_paths_follow_user_home():
    spec = load_spec("lab1", {"user": {"name": "alice", "uid": 3001}})
    assert spec.user.home == "/home/alice"
    assert spec.env.conda_prefix == "/home/alice/miniconda3"
    assert spec.env.model_dir == "/home/alice/models"
    spec = load_spec("lab1", {"user": {"home": "/srv/train"}, "env": {"data_dir": "/srv/train/d"}})
    assert spec.env.verl_checkout == "/srv/train/verl"
    assert spec.env.data_dir == "/srv/train/d"


def test_new_artifact_version_forgets_default_size():
    spec = load_spec(
        "lab1",
        {
            "cuda": {
                "version": "11.8.1",
                "filename": "c.run",
                "url": "https://example.invalid/c.run",
                "sha256": SHA_A,
            }
        },
    )
    assert spec.cuda.size is None


# -- bad values: each one names host, field, value and what is expected -------------------------

BAD = [
    # (dotted path set in `stack`, bad value, words of the expectation[, field shown])
    ("foo", 1, "unknown key 'foo' (allowed: driver, cuda"),
    ("cuda.sah256", SHA_A, "unknown key 'sah256' (allowed: version, filename, url, sha256"),
    ("cuda.sha256", "a" * 63, "expected 64 hex characters"),
    ("cuda.sha256", "g" * 64, "expected 64 hex characters"),
    ("cuda.sha256", "abc", "sha256sum of the file"),
    ("paths.cuda_dir", "usr/local/cuda", "expected an absolute path"),
    ("paths.artifact_cache", "/var/../tmp", "without '..'"),
    ("paths.cudnn_extract_dir", "/tmp/c", "not under /tmp"),
    ("paths.cudnn_extract_dir", "/var/tmp", "not under /var/tmp"),
    ("user.home", "home/verl", "expected an absolute path"),
    ("driver.version", "525", "NNN.NN.NN"),
    ("driver.version", "r525.147", "NNN.NN.NN"),
    ("cuda.version", "11.8", "X.Y.Z"),
    ("cudnn.version", "8.9.x", "8.9.7.29"),
    ("miniconda.version", "latest", "py310_24.11.1-0"),
    ("python_version", "3.10", "X.Y.Z"),
    ("python_version", "3.9.18", "3.10 or newer"),
    ("torch.version", "2.6.0_cu118", "PEP 440"),
    ("torch.torchvision", "latest", "PEP 440"),
    ("verl.version", "v0.5.0", "'0.5.0'"),
    ("apex.commit", "4bdecd06", "40-hex"),
    ("verl.commit", "z" * 40, "40-hex"),
    ("apex.ref", "bad ref", "git tag or branch"),
    ("driver.url", "ftp://x/d.run", "http"),
    ("cuda.url", "not a url", "http"),
    ("torch.index_url", "download.pytorch.org", "http"),
    ("mirror.artifacts_url", "10.0.0.1/a", "http"),
    ("mirror.pip_find_links", "wheels", "absolute"),
    ("driver.filename", "dl/d.run", "plain file name"),
    ("cuda.size", 0, "greater than 0"),
    ("user.uid", 0, "1000 to 60000"),
    ("user.uid", 999, "1000 to 60000"),
    ("user.uid", 65534, "1000 to 60000"),
    ("user.uid", "many", "whole number"),
    ("user.name", "Verl User", "Unix user name"),
    ("env.conda_prefix", "/opt/conda", "under user.home '/home/verl'"),
    ("env.data_dir", "/home/verl", "under user.home"),
    ("env.model_dir", "/home/verlx/m", "under user.home"),
    ("policy.conda_tos", "yes", "'accept' or 'conda-forge'"),
    ("policy.allow_reboot", "maybe", "True or False"),
    ("policy.force_reinstall", ["drvier"], "'driver'", "policy.force_reinstall[0]", "drvier"),
    ("policy.force_reinstall", "driver", "a list"),
    ("cuda", "11.8.0", "dict with keys from: version, filename"),
    ("mirror", ["http://m"], "dict"),
    ("driver.version", "525.125.06", "also set driver.filename, driver.sha256, driver.url"),
    ("verl.commit", "62549582a71881fe861b09f8375e3aea80ac6754", "also set verl.ref, verl.version"),
]


def _nest(path: str, value) -> dict:
    *parents, last = path.split(".")
    out: dict = {last: value}
    for part in reversed(parents):
        out = {part: out}
    return out


@pytest.mark.parametrize("case", BAD, ids=lambda c: f"{c[0]}={c[1]!r}"[:50])
def test_bad_value_names_host_field_value_and_expectation(case):
    path, value, expected, *shown = case
    field, shown_value = shown if shown else (path, value)
    err = refused(_nest(path, value), host="p40-07")
    assert isinstance(err, ValueError)
    line = str(err).splitlines()[0]
    assert line.startswith(f"host p40-07: stack.{field} = {shown_value!r}: "), line
    assert expected in line, line
    assert err.host == "p40-07"
    assert err.field == f"stack.{field}"
    assert len(line) < 400


def test_bad_value_in_stack_host_is_named_too():
    err = refused({}, _nest("user.uid", 12), host="p40-08")
    assert str(err).startswith("host p40-08: stack.user.uid = 12: expected a uid from 1000")


def test_contract_message_shape():
    err = refused({"cuda": {"sha256": "abc"}})
    assert str(err).startswith("host lab1: stack.cuda.sha256 = 'abc': expected 64 hex characters")
    assert (err.host, err.field, err.value) == ("lab1", "stack.cuda.sha256", "abc")
    assert "sha256sum" in err.expected
    # SpecError(host, field, value, expected) also works directly
    direct = SpecError("lab2", "stack.x", 1, "expected y")
    assert str(direct) == "host lab2: stack.x = 1: expected y"
    assert pickle.loads(pickle.dumps(err)).problems == err.problems


def test_one_line_per_error():
    err = refused({"cuda": {"sha256": "abc", "foo": 1}, "user": {"uid": 5}})
    lines = str(err).splitlines()
    assert len(lines) == 3 == len(err.problems)
    assert all(line.startswith("host lab1: stack.") for line in lines)
    assert {p[0] for p in err.problems} == {"stack.cuda.sha256", "stack.cuda.foo", "stack.user.uid"}


def test_error_says_when_value_came_from_stack_host():
    err = refused({"cuda": {"sha256": SHA_A}}, {"cuda": {"sha256": "abc"}})
    assert str(err).endswith("value set in stack_host")
    err = refused({"cuda": {"sha256": "abc"}}, {"policy": {"allow_reboot": True}})
    assert "stack_host" not in str(err)


def test_non_dict_stack_is_refused():
    err = refused("cuda=11.8")  # type: ignore[arg-type]
    assert str(err).startswith("host lab1: stack = 'cuda=11.8': expected a dict")
    err = refused({}, ["x"])  # type: ignore[arg-type]
    assert err.field == "stack_host"


def test_long_values_are_shortened():
    err = refused({"cuda": {"sha256": "x" * 500}})
    assert len(str(err)) < 300


# -- host data ----------------------------------------------------------------------------------


class _Data(dict):
    def get(self, key, default=None):
        return dict.get(self, key, default)

    def dict(self):
        return dict(self)


class _Host:
    def __init__(self, name, **data):
        self.name = name
        self.data = _Data(data)


def test_spec_for_host_reads_host_data_and_caches():
    clear_spec_cache()
    host = _Host("lab1", stack={"policy": {"allow_reboot": True}}, stack_host={"cuda": {"size": 5}})
    spec = spec_for_host(host)
    assert spec.policy.allow_reboot is True
    assert spec.cuda.size == 5
    assert spec_for_host(host) is spec  # cached per host name
    # changed data is not served stale
    host.data["stack_host"] = {"cuda": {"size": 6}}
    assert spec_for_host(host).cuda.size == 6
    assert spec_for_host(_Host("lab2")) == StackSpec()


def test_spec_for_host_refuses_stray_stack_keys():
    clear_spec_cache()
    with pytest.raises(SpecError) as info:
        spec_for_host(_Host("lab3", stack={}, stack_hosts={"cuda": {}}))
    assert str(info.value) == (
        "host lab3: stack_hosts = {'cuda': {}}: unknown host-data key 'stack_hosts' "
        "(allowed: stack, stack_host)"
    )


def test_spec_for_host_bad_value():
    clear_spec_cache()
    with pytest.raises(SpecError, match=r"^host lab4: stack\.cuda\.sha256 = 'abc': expected 64"):
        spec_for_host(_Host("lab4", stack={"cuda": {"sha256": "abc"}}))


# -- inventories --------------------------------------------------------------------------------


def _load_inventory(path: Path):
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    with ctx_state.use(State()):
        return make_inventory(str(path), cwd=str(REPO))


def test_lab_inventory_validates_for_every_host():
    clear_spec_cache()
    inventory = _load_inventory(REPO / "inventories" / "lab.py")
    hosts = {host.name: host for host in inventory}
    assert set(hosts) == {"p40-01", "p40-02", "p40-03"}
    for host in hosts.values():
        spec = spec_for_host(host)
        assert "p40" in host.groups
        assert host.data.get("ssh_hostname").startswith("192.0.2.")
        assert host.data.get("ssh_strict_host_key_checking") == "yes"
        assert host.data.get("ssh_known_hosts_file")
        assert spec.driver.version == "525.147.05"
    assert [h.name for h in inventory.get_group("ray_head")] == ["p40-01"]
    # group_data/all.py's stack reaches the hosts, p40-03's stack_host is merged over it
    assert spec_for_host(hosts["p40-01"]).policy.allow_reboot is False
    assert spec_for_host(hosts["p40-03"]).policy.allow_reboot is True
    assert spec_for_host(hosts["p40-03"]).paths.artifact_cache == "/data/p40fleet-cache"
    assert spec_for_host(hosts["p40-03"]).policy.conda_tos == "conda-forge"


def test_group_data_exports_only_stack_and_no_secret():
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import _get_group_data

    with ctx_state.use(State()):
        data = _get_group_data(str(REPO / "inventories" / "group_data" / "all.py"))["all"]
    assert set(data) == {"stack"}
    load_spec("any", data["stack"])

    def keys(value):
        if isinstance(value, dict):
            for key, sub in value.items():
                yield key
                yield from keys(sub)

    assert not [k for k in keys(data) if any(w in k for w in ("pass", "secret", "token", "key"))]


# -- security: no shell characters, no system directories, no option refs (S3, S5, S6, S7, S22) --

SHELL_BITS = ["$(touch X)", "`touch X`", ";touch X", "'x", '"x', "a b", "\\x"]


@pytest.mark.parametrize("bit", SHELL_BITS)
@pytest.mark.parametrize(
    "path, template",
    [
        ("paths.cuda_dir", "/usr/local/cuda-11.8{}"),
        ("paths.cuda_link", "/usr/local/cuda{}"),
        ("paths.artifact_cache", "/var/cache/p40fleet{}"),
        ("paths.cudnn_extract_dir", "/usr/local/src{}"),
        ("user.home", "/home/verl{}"),
        ("env.verl_checkout", "/home/verl/verl{}"),
        ("ray.temp_dir", "/tmp/ray{}"),
        ("mirror.pip_find_links", "/srv/wheels{}"),
        ("driver.filename", "d{}.run"),
        ("training.data.train_file", "train{}.parquet"),
        ("training.model.name", "Qwen{}"),
        ("driver.url", "https://example.invalid/d.run?{}"),
        ("mirror.artifacts_url", "http://10.0.0.1/a{}"),
        ("mirror.pip_index_url", "http://10.0.0.1/simple{}"),
        ("verl.remote", "https://example.invalid/verl{}"),
    ],
)
def test_shell_characters_are_refused(path, template, bit):
    if bit.startswith("\\") and "url" not in path and "remote" not in path:
        bit = "x\\y"  # a path's backslash
    err = refused(_nest(path, template.format(bit)))
    assert err.field == f"stack.{path}", str(err)
    assert "host lab1: stack." in str(err)


@pytest.mark.parametrize(
    "path, value",
    [
        ("user.home", "/etc"),
        ("user.home", "/usr"),
        ("user.home", "/home"),
        ("user.home", "/root"),
        ("user.home", "/var"),
        ("user.home", "/var/lib/verl"),
        ("user.home", "/srv"),
        ("user.home", "/usr/local/verl"),
        ("paths.cuda_dir", "/"),
        ("paths.cuda_dir", "/usr"),
        ("paths.cuda_dir", "/usr/local"),
        ("paths.cuda_dir", "/opt"),
        ("paths.cuda_dir", "/etc/cuda"),
        ("paths.cuda_dir", "/usr/local/toolkit"),
        ("paths.cuda_link", "/usr/bin/python3"),
        ("paths.cuda_link", "/usr/local/bin"),
        ("paths.artifact_cache", "/"),
        ("paths.artifact_cache", "/tmp"),
        ("paths.artifact_cache", "/var/tmp"),
        ("paths.artifact_cache", "/dev/shm"),
        ("paths.artifact_cache", "/tmp/p40fleet"),
        ("paths.artifact_cache", "/etc"),
        ("paths.artifact_cache", "/var"),
        ("paths.artifact_cache", "/home/verl/cache"),
        ("paths.artifact_cache", "/usr/bin/x"),
        ("paths.cudnn_extract_dir", "/"),
        ("paths.cudnn_extract_dir", "/usr"),
        ("paths.cudnn_extract_dir", "/etc/x"),
    ],
)
def test_system_directories_are_refused(path, value):
    err = refused(_nest(path, value), host="p40-07")
    line = str(err).splitlines()[0]
    assert line.startswith(f"host p40-07: stack.{path} = {value!r}: expected "), line


@pytest.mark.parametrize(
    "path, value",
    [
        ("user.home", "/home/alice"),
        ("user.home", "/srv/train"),
        ("user.home", "/data/users/verl"),
        ("paths.cuda_dir", "/opt/cuda-11.8"),
        ("paths.cuda_dir", "/usr/local/CUDA-11.8.0"),
        ("paths.artifact_cache", "/data/p40fleet-cache"),
        ("paths.artifact_cache", "/var/cache/p40fleet"),
        ("paths.cudnn_extract_dir", "/usr/local/src/p40fleet"),
        ("mirror.pip_find_links", "http://10.0.0.1:8111/wheels/"),
        ("driver.url", "https://example.invalid/d.run?a=1&b=2"),
    ],
)
def test_dedicated_directories_and_plain_urls_are_accepted(path, value):
    load_spec("lab1", _nest(path, value))


@pytest.mark.parametrize(
    "home, path, value",
    [
        ("/srv/verl", "artifact_cache", "/srv/verl/cache"),  # the review's S7b
        ("/data/verl", "cudnn_extract_dir", "/data/verl/src"),
        ("/data/verl", "cudnn_extract_dir", "/data/verl"),
        ("/data/users/verl", "artifact_cache", "/data/users/verl/.cache/p40fleet"),
    ],
)
def test_root_dirs_inside_a_home_outside_slash_home_are_refused(home, path, value):
    # S7: the training user can rename anything in its home, so it could swap the directory
    # root runs from; /home is refused by the path rule, homes under /srv and /data by this one
    err = refused({"user": {"home": home}, "paths": {path: value}})
    assert err.field == f"stack.paths.{path}", str(err)
    assert f"outside user.home {home!r}" in str(err)
    load_spec("lab1", {"user": {"home": home}, "paths": {path: "/var/lib/p40fleet-x"}})


@pytest.mark.parametrize("ref", ["--recurse-submodules", "-b", "-x/y"])
def test_refs_starting_with_a_dash_are_refused(ref):
    for pin in ("apex", "verl"):
        err = refused({pin: {"ref": ref, "commit": "4" * 40}})
        assert err.field == f"stack.{pin}.ref", str(err)
        assert "not starting with '-'" in str(err)


# -- S17: strict host-key checking for every SSH host --------------------------------------------


def _host_with(data: dict):
    from tests.opharness import make_host

    return make_host(data, "p40-09")[1]


def test_host_without_strict_host_key_checking_is_refused():
    from p40fleet.spec import host_key_problem

    spec = load_spec("p40-09", {})
    for value in (None, "accept-new", "no"):
        host = _host_with({} if value is None else {"ssh_strict_host_key_checking": value})
        problem = host_key_problem(host, spec)
        assert problem is not None, value
        line = str(problem)
        assert line.startswith("host p40-09: ssh_strict_host_key_checking = "), line
        assert "allow_unverified_host_keys" in line
    assert host_key_problem(_host_with({"ssh_strict_host_key_checking": "yes"}), spec) is None
    allowed = load_spec("p40-09", {"policy": {"allow_unverified_host_keys": True}})
    assert host_key_problem(_host_with({}), allowed) is None


def test_local_hosts_need_no_host_key():
    from pyinfra.api import Config, Inventory, State

    from p40fleet.spec import host_key_problem

    inventory = Inventory((["@local"], {}))
    State(inventory, Config())
    assert host_key_problem(inventory.get_host("@local"), load_spec("@local", {})) is None


# -- mirror: apt source and conda channel --------------------------------------------------------

LAB_APT = {"url": "http://10.231.0.1:8111/apt", "suite": "./", "trusted": True}


HTTP_CONDA = {"policy": {"allow_http_conda_channel": True}}


def test_mirror_apt_and_conda_channel_accepted(tmp_path):
    spec = load_spec("lab1", {"mirror": {"apt": LAB_APT, "conda_channel": "https://m/conda/"}})
    assert spec.mirror.apt.trusted and spec.mirror.apt.components == ()
    assert spec.mirror.conda_channel == "https://m/conda"
    key = tmp_path / "mirror.gpg"
    key.write_bytes(b"key")
    apt = {"url": "https://m/ubuntu", "suite": "focal", "components": ["main"],
           "signed_by": str(key)}  # fmt: skip
    assert load_spec("lab1", {"mirror": {"apt": apt}}).mirror.apt.signed_by == str(key)


@pytest.mark.parametrize(
    ("apt", "field", "words"),
    [
        # apt's signature check is never turned off unless the spec says trusted: True
        ({"url": "http://m/apt", "suite": "./"}, "signed_by", "or trusted: True"),
        ({"url": "http://m/apt", "suite": "./", "components": ["main"], "trusted": True},
         "components", "no components with a flat suite"),
        ({"url": "http://m/u", "suite": "focal", "trusted": True}, "components", "at least one"),
        ({"url": "http://m/u", "suite": "focal", "components": ["main"],
          "signed_by": "/nonexistent/mirror.gpg"}, "signed_by", "existing key file"),
        ({"url": "http://m/u", "suite": "focal", "components": ["main"],
          "signed_by": "/etc/hostname"}, "signed_by", "*.gpg (binary) or *.asc"),
        ({"url": "http://m/u", "suite": "focal", "components": ["main"], "trusted": True,
          "signed_by": "/k.gpg"}, "trusted", "trusted: False with signed_by"),
        ({"url": "ftp://m/u", "suite": "./", "trusted": True}, "url", "http:// or https://"),
        ({"url": "http://m/u", "suite": "focal main", "trusted": True}, "suite", "apt suite"),
        ({"url": "http://m/u", "suite": "./", "extra_suites": ["x"], "trusted": True},
         "extra_suites", "expected none with a flat suite"),
    ],
)  # fmt: skip
def test_bad_mirror_apt_names_host_and_field(apt, field, words):
    error = refused({"mirror": {"apt": apt}}, host="lab2")
    assert error.host == "lab2"
    line = next(line for line in error.lines() if f"stack.mirror.apt.{field} =" in line)
    assert line.startswith("host lab2: ") and words in line


def test_http_conda_channel_refused_without_the_policy_opt_in():
    """N7: conda fetches the env's packages from the channel: plain http only when asked."""
    error = refused({"mirror": {"conda_channel": "http://192.0.2.1:8111/conda"}}, host="lab2")
    assert [field for field, _, _ in error.problems] == ["stack.mirror.conda_channel"]
    line = next(line for line in error.lines() if "stack.mirror.conda_channel =" in line)
    assert line.startswith("host lab2: ") and "expected an https:// channel" in line
    assert "stack.policy.allow_http_conda_channel: True" in line
    spec = load_spec("lab1", {"mirror": {"conda_channel": "http://192.0.2.1:8111/conda"},
                              **HTTP_CONDA})  # fmt: skip
    assert spec.mirror.conda_channel == "http://192.0.2.1:8111/conda"
    assert not StackSpec().policy.allow_http_conda_channel  # off by default
    # the example inventory's channel is https
    example = (REPO / "inventories" / "group_data" / "all.py").read_text()
    assert '"conda_channel": "https://' in example and '"conda_channel": "http://' not in example


def test_air_gapped_mirror_needs_every_source():
    error = refused({"mirror": {"air_gapped": True, "artifacts_url": "http://m/a"}})
    fields = [field for field, _, _ in error.problems]
    assert fields == ["stack.mirror.pip_index_url", "stack.mirror.git_base_url",
                      "stack.mirror.apt", "stack.mirror.conda_channel"]  # fmt: skip
    assert all("air-gapped host has no other source" in line for line in error.lines())
    full = {"air_gapped": True, "artifacts_url": "http://m/a", "pip_index_url": "http://m/s",
            "git_base_url": "http://m/git", "apt": LAB_APT,
            "conda_channel": "http://m/c"}  # fmt: skip
    assert load_spec("lab1", {"mirror": full, **HTTP_CONDA}).mirror.air_gapped


# -- the package's shape -------------------------------------------------------------------------


def test_spec_package_imports_run_one_way():
    """fields <- proxy <- pins <- errors <- load: no module imports one to its right."""
    import ast

    order = ["fields", "proxy", "pins", "errors", "load"]
    for index, name in enumerate(order):
        tree = ast.parse((REPO / "p40fleet" / "spec" / f"{name}.py").read_text())
        imported = {
            node.module.rsplit(".", 1)[-1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("p40fleet.spec.")
        }
        assert imported <= set(order[:index]), (name, imported)


def test_every_public_name_is_re_exported():
    import p40fleet.spec as package

    for name in package.__all__:
        assert getattr(package, name) is not None
    assert package.StackSpec is package.pins.StackSpec
    assert package.SpecError.__module__ == "p40fleet.spec.errors"


# -- training archives: what focal's tar 1.30 unpacks ------------------------------------------


def _archive(which: str, filename: str) -> dict:
    url = f"https://example.invalid/{filename}"
    return {"training": {which: {"archive": {"filename": filename, "sha256": SHA_A, "url": url}}}}


@pytest.mark.parametrize("which", ["model", "data"])
@pytest.mark.parametrize("filename", ["m.tar.zst", "m.tzst", "m.tar.zstd", "M.TAR.ZST"])
def test_a_zstd_training_archive_is_refused_naming_the_formats_that_work(which, filename):
    err = refused(_archive(which, filename))
    assert err.field == f"stack.training.{which}.archive.filename", str(err)
    text = str(err)
    assert "host lab1:" in text and "tar 1.30" in text and "zstd" in text
    for works in (".tar.gz", ".tar.bz2", ".tar.xz", ".tar,"):
        assert works in text, text


@pytest.mark.parametrize("filename", ["m.zip", "m.7z", "m.tar.lz4", "m"])
def test_a_training_archive_of_another_format_is_refused(filename):
    err = refused(_archive("data", filename))
    assert err.field == "stack.training.data.archive.filename", str(err)
    assert "zstd" not in str(err) and ".tar.xz" in str(err)


@pytest.mark.parametrize(
    "filename", ["m.tar", "m.tar.gz", "m.tgz", "m.tar.bz2", "m.tbz2", "m.tar.xz", "M.TXZ"]
)
def test_gz_bz2_xz_and_plain_training_archives_are_accepted(filename):
    spec = load_spec("lab1", _archive("model", filename))
    assert spec.training.model.archive.filename == filename


def test_dpkg_lock_wait_defaults_to_ten_minutes_and_is_bounded():
    assert load_spec("lab1", {}).policy.dpkg_lock_wait_s == 600
    assert load_spec("lab1", {"policy": {"dpkg_lock_wait_s": 60}}).policy.dpkg_lock_wait_s == 60
    for bad in (0, -5, 7200, "soon"):
        err = refused({"policy": {"dpkg_lock_wait_s": bad}})
        assert err.field == "stack.policy.dpkg_lock_wait_s", str(err)


# -- security N9: no credentials in spec URLs ---------------------------------------------------

CREDS = "https://deploy:S3cr3tT0ken@mirror.example"


@pytest.mark.parametrize(
    ("stack", "field"),
    [
        ({"mirror": {"pip_index_url": CREDS + "/simple"}}, "stack.mirror.pip_index_url"),
        ({"mirror": {"artifacts_url": CREDS + "/a"}}, "stack.mirror.artifacts_url"),
        ({"mirror": {"git_base_url": CREDS + "/git"}}, "stack.mirror.git_base_url"),
        ({"mirror": {"conda_channel": CREDS + "/conda"}}, "stack.mirror.conda_channel"),
        ({"mirror": {"pip_find_links": CREDS + "/wheels"}}, "stack.mirror.pip_find_links"),
        ({"torch": {"index_url": CREDS + "/whl/cu118"}}, "stack.torch.index_url"),
        ({"driver": {"url": CREDS + "/d.run"}}, "stack.driver.url"),
        ({"verl": {"remote": "https://S3cr3tT0ken@git.example/verl"}}, "stack.verl.remote"),
        (
            {
                "mirror": {
                    "apt": {
                        "url": CREDS + "/ubuntu",
                        "suite": "focal",
                        "components": ["main"],
                        "trusted": True,
                    }
                }
            },
            "stack.mirror.apt.url",
        ),
    ],  # fmt: skip
)
def test_a_url_with_credentials_is_refused_and_never_shown(stack, field):
    err = refused(stack)
    assert err.field == field
    assert "expected a URL without credentials" in str(err)
    # where they belong instead, per tool
    for where in ("~/.netrc", "/etc/apt/auth.conf.d/", "conda auth login", "docs/air-gapped.md"):
        assert where in str(err), str(err)
    assert "S3cr3tT0ken" not in str(err) + repr(err.problems) + repr(
        pickle.loads(pickle.dumps(err))
    )


def test_a_bad_url_with_credentials_shows_no_password_either():
    err = refused({"mirror": {"pip_index_url": CREDS + "/sim ple"}})
    assert "S3cr3tT0ken" not in str(err) and "deploy:***@" in str(err)


def test_proxy_credentials_stay_allowed():
    spec = load_spec("lab1", {"proxy": {"http": "http://bob:pw@proxy.lab:3128"}})
    assert spec.proxy.has_secret


# -- security N13: lengths, hosts, accounts, overlaps, messages ---------------------------------


@pytest.mark.parametrize(
    ("stack", "field", "words"),
    [
        (
            {"paths": {"artifact_cache": "/var/cache/" + "a" * 10000}},
            "stack.paths.artifact_cache",
            "at most 4095 bytes",
        ),
        (
            {"paths": {"artifact_cache": "/var/cache/" + "a" * 256}},
            "stack.paths.artifact_cache",
            "at most 255 bytes",
        ),
        ({"user": {"home": "/home/" + "v" * 300}}, "stack.user.home", "at most 255 bytes"),
        (
            {"driver": {"filename": "a" * 300 + ".run"}},
            "stack.driver.filename",
            "at most 255 bytes",
        ),
        (
            {"driver": {"url": "https://x/" + "a" * 100000}},
            "stack.driver.url",
            "at most 2048 characters",
        ),
    ],  # fmt: skip
)
def test_too_long_paths_names_and_urls_are_refused(stack, field, words):
    err = refused(stack)
    assert err.field == field and words in str(err), str(err)


def test_the_longest_allowed_component_and_url_pass():
    assert load_spec("lab1", {"driver": {"filename": "a" * 251 + ".run"}})
    assert load_spec("lab1", {"paths": {"artifact_cache": "/var/cache/" + "a" * 255}})
    assert load_spec("lab1", {"driver": {"url": "https://x/" + "a" * 2038}})


@pytest.mark.parametrize(
    "url",
    [
        "https://us.download.nvidi\u0430.com/tesla/d.run",  # Cyrillic a
        "https://xn--nvidi-7ve.com/d.run",
        "https://mirror.XN--p1ai/d.run",
    ],
)
def test_lookalike_and_punycode_url_hosts_are_refused(url):
    err = refused({"driver": {"url": url}})
    assert "expected an ASCII host name" in str(err), str(err)


def test_non_ascii_elsewhere_in_a_url_must_be_percent_encoded():
    err = refused({"driver": {"url": "https://m.example/\u00e9.run"}})
    assert "percent-encode" in str(err)
    assert load_spec("lab1", {"driver": {"url": "https://m.example/%C3%A9.run"}})


def test_an_ipv6_head_address_is_accepted_bare_or_in_brackets():
    for value in ("2001:db8::1", "[2001:db8::1]", "[2001:DB8:0::1]"):
        assert load_spec("lab1", {"ray": {"head_address": value}}).ray.head_address == "2001:db8::1"
    err = refused({"ray": {"head_address": "[node1.lab]"}})
    assert "expected an IPv6 address inside [ ]" in str(err)


@pytest.mark.parametrize(
    "name", ["root", "daemon", "bin", "sys", "nobody", "www-data", "sshd", "admin",
             "systemd-network", "_apt"],
)  # fmt: skip
def test_system_account_names_are_refused_as_the_training_user(name):
    err = refused({"user": {"name": name}})
    assert err.field == "stack.user.name" and "not a system or administrator account" in str(err)


def test_a_uid_below_1000_is_refused_and_a_regular_account_passes():
    assert "uid from 1000" in str(refused({"user": {"uid": 999}}))
    assert (
        load_spec("lab1", {"user": {"name": "trainer", "uid": 1000}}).user.home == "/home/trainer"
    )


def test_the_training_user_is_never_the_account_p40fleet_connects_as():
    clear_spec_cache()
    with pytest.raises(SpecError) as info:
        spec_for_host(_Host("lab5", ssh_user="ops", stack={"user": {"name": "ops"}}))
    assert info.value.field == "stack.user.name" and "other than ssh_user" in str(info.value)
    clear_spec_cache()
    assert spec_for_host(_Host("lab5", ssh_user="ops", stack={})).user.name == "verl"


@pytest.mark.parametrize(
    ("stack", "field", "words"),
    [
        (
            {"env": {"verl_checkout": "/home/verl/miniconda3"}},
            "stack.env.verl_checkout",
            "apart from env.conda_prefix",
        ),
        (
            {"env": {"data_dir": "/home/verl/x", "model_dir": "/home/verl/x"}},
            "stack.env.model_dir",
            "apart from env.data_dir",
        ),
        (
            {"env": {"model_dir": "/home/verl/data/models"}},
            "stack.env.model_dir",
            "apart from env.data_dir",
        ),
        (
            {"env": {"conda_prefix": "/home/verl/verl/conda"}},
            "stack.env.verl_checkout",
            "apart from env.conda_prefix",
        ),
        ({"env": {"data_dir": "/home/verl/.ssh"}}, "stack.env.data_dir", "outside ~/.ssh"),
        ({"env": {"model_dir": "/home/verl/.ssh/m"}}, "stack.env.model_dir", "outside ~/.ssh"),
        ({"env": {"data_dir": "/home/verl/.gnupg/d"}}, "stack.env.data_dir", "outside ~/.gnupg"),
        ({"ray": {"temp_dir": "/"}}, "stack.ray.temp_dir", "not a system directory"),
        ({"ray": {"temp_dir": "/etc"}}, "stack.ray.temp_dir", "not a system directory"),
        ({"ray": {"temp_dir": "/usr/lib/ray"}}, "stack.ray.temp_dir", "not a system directory"),
        ({"ray": {"temp_dir": "/tmp"}}, "stack.ray.temp_dir", "not a system directory"),
        (
            {"training": {"data": {"train_file": "a.parquet", "val_file": "a.parquet"}}},
            "stack.training.data.val_file",
            "other than train_file",
        ),
    ],  # fmt: skip
)
def test_overlapping_env_paths_and_system_temp_dirs_are_refused(stack, field, words):
    err = refused(stack)
    assert err.field == field and words in str(err), str(err)


def test_separate_env_paths_and_own_temp_dirs_pass():
    spec = load_spec(
        "lab1",
        {
            "env": {"data_dir": "/home/verl/d", "model_dir": "/home/verl/dm"},  # a prefix only
            "ray": {"temp_dir": "/var/tmp/ray"},
        },
    )
    assert (spec.env.data_dir, spec.ray.temp_dir) == ("/home/verl/d", "/var/tmp/ray")


def test_env_path_outside_home_suggests_that_fields_own_default():
    err = refused({"env": {"conda_prefix": "/home/verl"}})
    assert str(err).endswith("e.g. '/home/verl/miniconda3'"), str(err)
    err = refused({"env": {"data_dir": "/srv/data"}})
    assert str(err).endswith("e.g. '/home/verl/data'"), str(err)


@pytest.mark.parametrize("value", [3.10, 3.1012, 3])
def test_a_python_version_written_as_a_number_says_to_quote_it(value):
    err = refused({"python_version": value})
    assert "string in quotes, such as '3.10.12'" in str(err) and "3.10 is 3.1" in str(err)


@pytest.mark.parametrize(
    "key", ["Stack_host", "host_stack", "STACK", "Stack", "stack-host", "stakc_host", "stak",
            "stackhost", "stack_hosts", "my_stack"],
)  # fmt: skip
def test_host_data_keys_close_to_stack_are_refused_with_the_allowed_names(key):
    clear_spec_cache()
    with pytest.raises(SpecError) as info:
        spec_for_host(_Host("lab6", **{key: {"policy": {"allow_reboot": True}}}))
    assert info.value.field == key
    assert f"unknown host-data key {key!r} (allowed: stack, stack_host)" in str(info.value)


def test_pyinfra_host_data_keys_are_not_taken_for_stack():
    from p40fleet.spec import stray_host_key

    for key in ("ssh_hostname", "ssh_user", "ssh_port", "ssh_key", "ssh_known_hosts_file",
                "ssh_strict_host_key_checking", "_sudo", "_sudo_user", "_env", "_su_user",
                "p40fleet_run_lock", "state", "task", "track", "stack", "stack_host"):  # fmt: skip
        assert not stray_host_key(key), key


@pytest.mark.parametrize(
    ("stack", "stack_host", "anchors"),
    [
        ({}, {"torch": {"sha256": {"torchvision": SHA_A}}}, ["torch.sha256"]),
        (
            {},
            {"policy": {"allow_unverified_host_keys": True}},
            ["policy.allow_unverified_host_keys"],
        ),
        ({"mirror": {"artifacts_url": "https://m/a"}}, {"mirror": None}, ["mirror"]),
        (
            {},
            {"cuda": {"sha256": SHA_A}, "verl": {"commit": "b" * 40}},
            ["cuda.sha256", "verl.commit"],
        ),
        ({}, {"mirror": {"apt": {"trusted": True}}}, ["mirror.apt.trusted"]),
        # the same value as stack's, or no anchor at all: nothing to say
        (
            {"policy": {"allow_unverified_host_keys": True}},
            {"policy": {"allow_unverified_host_keys": True}},
            [],
        ),
        (
            {},
            {"driver": {"url": "http://other.example/d.run"}, "policy": {"allow_reboot": True}},
            [],
        ),
        ({}, None, []),
    ],  # fmt: skip
)
def test_stack_host_replacing_a_trust_anchor_is_named(stack, stack_host, anchors):
    from p40fleet.spec import trust_anchor_overrides

    assert trust_anchor_overrides(stack, stack_host) == anchors


def test_pins_py_holds_no_check_across_fields_rules_py_does():
    """pins.py is the defaults file: each model's after-validator is one call into rules.py,
    where the checks across fields live (issue #29); the supported OS list is a pin."""
    import ast

    from p40fleet import preflight
    from p40fleet.spec import SUPPORTED_OS, rules

    tree = ast.parse((REPO / "p40fleet" / "spec" / "pins.py").read_text())
    checks = {}
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        for func in (node for node in cls.body if isinstance(node, ast.FunctionDef)):
            if "model_validator(mode='after')" not in map(ast.unparse, func.decorator_list):
                continue
            (body,) = func.body  # one statement: return rules.check_<model>(self, ...)
            assert isinstance(body, ast.Return) and isinstance(body.value, ast.Call), cls.name
            checks[cls.name] = ast.unparse(body.value.func)
    assert checks == {
        "Paths": "rules.check_paths",
        "TrainingUser": "rules.check_user",
        "AptMirror": "rules.check_apt_mirror",
        "Mirror": "rules.check_mirror",
        "RayCluster": "rules.check_ray",
        "TrainingData": "rules.check_training_data",
        "StackSpec": "rules.check_stack",
    }
    assert set(rules.__all__) == {name.removeprefix("rules.") for name in checks.values()}
    assert preflight.SUPPORTED_OS is SUPPORTED_OS == ("Ubuntu 20.04", "Ubuntu 22.04")
