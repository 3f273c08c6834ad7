"""operations/uninstall.py: facts in, commands out (tests/opharness.py); the second run no-ops."""

from __future__ import annotations

import pytest
from pyinfra.facts.files import File, Link
from pyinfra.facts.server import Groups, Users, Which
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from p40fleet.facts.driver import InstalledDriverVersion
from p40fleet.facts.footprint import PathKinds
from p40fleet.facts.mirror import AptSources, AptSourceState
from p40fleet.facts.nouveau import FileStamp, FileStampFact
from p40fleet.footprint import BLACKLIST_FILE, MIRROR_LIST
from p40fleet.operations import uninstall
from p40fleet.ray import TOKEN_FILE, UNIT_NAME, UNIT_PATH
from tests.opharness import at, run_op

RUNFILE = "/var/cache/p40fleet/NVIDIA-Linux-x86_64-525.147.05.run"
VERSION = "525.147.05"
HOME = "/home/verl"


def kinds(present: dict[str, str]):
    """A PathKinds answer: the kinds of the asked paths that are in ``present``."""
    return lambda paths: {p: present[p] for p in paths if p in present}


def driver(which: str | None, installed: str | None, cached: bool = True):
    facts = {
        at(Which, command="nvidia-uninstall"): which,
        InstalledDriverVersion: installed,
        PathKinds: kinds({RUNFILE: "file"} if cached else {}),
    }
    return run_op(uninstall.driver_removed, version=VERSION, runfile=RUNFILE, facts=facts)


def test_the_driver_goes_through_its_own_uninstaller_then_nothing_is_left_to_do():
    first = driver("/usr/bin/nvidia-uninstall", VERSION)
    assert first.commands == ["nvidia-uninstall --silent"]
    assert "until the next reboot" in first.logs[-1]
    again = driver(None, None)
    assert not again.changed and again.noops == ["no NVIDIA driver installed"]


def test_without_nvidia_uninstall_the_cached_runfile_uninstalls_its_own_version():
    assert driver(None, VERSION).commands == [f"sh {RUNFILE} --uninstall --silent"]
    other = driver(None, "535.54.03")  # not this runfile's: installed some other way
    assert not other.changed and "left as it is" in other.logs[0]
    gone = driver(None, VERSION, cached=False)
    assert not gone.changed and "not a runfile install" in gone.logs[0]


def test_the_ray_unit_is_stopped_disabled_removed_and_systemd_reloaded():
    present = run_op(uninstall.ray_unit_removed, facts={
        File: {"mode": 644, "user": "root", "group": "root"},
        SystemdStatus: {UNIT_NAME: True}, SystemdEnabled: {UNIT_NAME: True},
    })  # fmt: skip
    assert present.commands == [
        f"systemctl stop {UNIT_NAME}", f"systemctl disable {UNIT_NAME}", f"rm -f {UNIT_PATH}",
        "systemctl daemon-reload", f"rm -f {TOKEN_FILE}",
    ]  # fmt: skip
    gone = run_op(uninstall.ray_unit_removed, facts={File: None})
    assert not gone.changed and gone.noops == [f"no {UNIT_NAME}"]


def link(target: str | None):
    info = {"link_target": target} if target else ({"mode": 755} if target == "" else None)
    return run_op(uninstall.cuda_link_removed, cuda_link="/usr/local/cuda",
                  cuda_dir="/usr/local/cuda-11.8", facts={Link: info})  # fmt: skip


def test_the_cuda_link_goes_only_while_it_points_at_our_cuda_dir():
    assert link("/usr/local/cuda-11.8").commands == ["rm -f /usr/local/cuda"]
    assert link("cuda-11.8").commands == ["rm -f /usr/local/cuda"]  # relative, same dir
    for other in ("/usr/local/cuda-12.2", ""):  # another toolkit's link, a real directory
        kept = link(other)
        assert not kept.changed and "left as it is" in kept.noops[0]
    assert link(None).noops == ["no /usr/local/cuda"]


@pytest.mark.parametrize(
    ("kind", "command"),
    [
        ("dir", "rm -rf --one-file-system -- /usr/local/cuda-11.8"),
        ("file", "rm -f -- /usr/local/cuda-11.8"),
        ("link", "rm -f -- /usr/local/cuda-11.8"),  # the link itself, never its target
    ],
)
def test_a_root_owned_path_is_removed_without_following_links(kind, command):
    path = "/usr/local/cuda-11.8"
    first = run_op(uninstall.path_removed, path=path, facts={PathKinds: kinds({path: kind})})
    assert first.commands == [command]
    again = run_op(uninstall.path_removed, path=path, facts={PathKinds: kinds({})})
    assert not again.changed and again.noops == [f"no {path}"]


def test_path_removed_refuses_what_is_no_footprint_path():
    for path in ("/", "/home/", "relative/dir"):
        with pytest.raises(ValueError, match="not a footprint path"):
            run_op(uninstall.path_removed, path=path, facts={PathKinds: kinds({})})


def test_the_nouveau_blacklist_goes_with_an_initramfs_rebuilt_without_it():
    stamp = FileStamp(mtime=1, text="blacklist nouveau\noptions nouveau modeset=0\n")
    which = at(Which, command="update-initramfs")
    first = run_op(uninstall.nouveau_restored, facts={FileStampFact: stamp, which: "/usr/sbin/x"})
    (command,) = first.commands
    aside = f"{BLACKLIST_FILE}.p40fleet-removed"
    assert command.startswith(f"mv -f {BLACKLIST_FILE} {aside} && if update-initramfs -u;")
    assert f"else mv -f {aside} {BLACKLIST_FILE} ; exit 1; fi" in command  # a failed rebuild
    no_tool = run_op(uninstall.nouveau_restored, facts={FileStampFact: stamp, which: None})
    assert no_tool.commands == [f"rm -f {BLACKLIST_FILE}"] and "yourself" in no_tool.logs[0]
    again = run_op(uninstall.nouveau_restored, facts={FileStampFact: None})
    assert not again.changed


def test_the_mirror_source_and_key_are_removed():
    key = "/etc/apt/keyrings/p40fleet-mirror.gpg"
    first = run_op(uninstall.apt_mirror_removed,
                   facts={PathKinds: kinds({MIRROR_LIST: "file", key: "file"})})  # fmt: skip
    assert first.commands == [f"rm -f -- {MIRROR_LIST} {key}"]
    again = run_op(uninstall.apt_mirror_removed, facts={PathKinds: kinds({})})
    assert not again.changed


def test_sources_moved_aside_go_back_where_they_were_unless_taken_again():
    aside = (("sources.list", True), ("sources.list.d/cuda.list", True))
    first = run_op(uninstall.apt_aside_restored, facts={AptSources: AptSourceState(aside=aside)})
    assert first.commands == [
        "mkdir -p /etc/apt /etc/apt/sources.list.d",
        "mv -T /etc/apt/p40fleet-aside/sources.list /etc/apt/sources.list",
        "mv -T /etc/apt/p40fleet-aside/sources.list.d/cuda.list /etc/apt/sources.list.d/cuda.list",
        "find /etc/apt/p40fleet-aside -depth -type d -empty -delete",
    ]
    taken_state = AptSourceState(aside=(("sources.list", False),))
    taken = run_op(uninstall.apt_aside_restored, facts={AptSources: taken_state})
    assert not taken.changed and "stays aside" in taken.logs[0]
    again = run_op(uninstall.apt_aside_restored, facts={AptSources: AptSourceState()})
    assert not again.changed


def test_a_left_over_build_account_is_deleted_without_its_home():
    first = run_op(uninstall.account_removed, account="p40fleet-apex",
                   facts={Users: {"p40fleet-apex": {}}})  # fmt: skip
    assert first.commands == ["userdel p40fleet-apex"]
    assert not run_op(uninstall.account_removed, account="p40fleet-apex",
                      facts={Users: {}}).changed  # fmt: skip


def home(policy: str, users: dict, groups: list, present: dict):
    return run_op(uninstall.home_removed, user="verl", home=HOME, policy=policy,
                  facts={Users: users, Groups: groups, PathKinds: kinds(present)})  # fmt: skip


def test_the_home_is_kept_by_default():
    kept = home("keep", {"verl": {}}, ["verl"], {HOME: "dir"})
    assert not kept.changed and "kept (stack.policy.uninstall_home)" in kept.noops[0]


def test_removing_the_home_empties_it_as_the_user_then_root_only_rmdirs_and_userdels():
    first = home("remove", {"verl": {}}, ["verl"], {HOME: "dir"})
    assert first.commands == [
        "su -s /bin/sh verl -c 'find /home/verl -mindepth 1 -maxdepth 1 -exec rm -rf "
        "--one-file-system -- {} +'",
        "rmdir /home/verl",
        "userdel verl",  # never -r: it would delete the home as root
        "if getent group verl >/dev/null; then groupdel verl ; fi",
    ]
    assert not any("userdel -r" in c for c in first.commands)
    again = home("remove", {}, [], {})
    assert not again.changed and again.noops == ["no /home/verl and no account verl"]


def test_root_never_deletes_a_home_whose_owner_is_gone_or_that_is_a_link():
    orphan = home("remove", {}, [], {HOME: "dir"})
    assert orphan.commands == ["function _fail"] and "root does not act" in orphan.failures[0]
    planted = home("remove", {"verl": {}}, ["verl"], {HOME: "link"})
    assert planted.commands == ["function _fail"] and "a symlink" in planted.failures[0]


CLEAN = {  # a host with nothing of the footprint on it
    PathKinds: kinds({}), Which: None, InstalledDriverVersion: None, File: None, Link: None,
    FileStampFact: None, AptSources: AptSourceState(), Users: {}, Groups: [],
}  # fmt: skip


OPERATIONS = {
    name: getattr(uninstall, name)
    for name in uninstall.__all__
    if hasattr(getattr(uninstall, name), "_inner")
}


def planned(monkeypatch, spec) -> list[tuple[str, dict]]:
    """The operations deploy/uninstall.py adds for ``spec``, in order: (name, kwargs)."""
    from p40fleet import footprint

    calls: list[tuple[str, dict]] = []
    for name in OPERATIONS:
        monkeypatch.setattr(uninstall, name, lambda _n=name, **kw: calls.append((_n, kw)))
    for kind in uninstall.ORDER:
        for item in footprint.items(spec, undo=kind):
            uninstall.undo(item, spec)
    return calls


def test_the_whole_uninstall_on_a_clean_host_changes_nothing(monkeypatch):
    from p40fleet.spec import load_spec

    spec = load_spec("lab1", {"policy": {"uninstall_home": "remove"}})
    calls = planned(monkeypatch, spec)
    ops = [name for name, _ in calls]
    assert ops[:2] == ["ray_unit_removed", "driver_removed"]  # the member stops first
    assert ops.index("driver_removed") < ops.index("path_removed")  # runfile still cached
    assert ops[-1] == "home_removed" and ops.count("home_removed") == 1
    removed = [kw["path"] for name, kw in calls if name == "path_removed"]
    assert {"/usr/local/cuda-11.8", "/etc/profile.d/cuda.sh", "/var/cache/p40fleet",
            "/etc/p40fleet"} <= set(removed)  # fmt: skip
    # one PathKinds command per host: every operation asks its paths as the same tuple
    amongs = {kw["among"] for _, kw in calls if "among" in kw}
    assert amongs == {uninstall.watched(spec)}, amongs
    asked = {kw.get("path") or kw.get("runfile") or kw.get("home") for _, kw in calls
             if "among" in kw} - {None}  # fmt: skip
    assert asked <= set(uninstall.watched(spec)), asked - set(uninstall.watched(spec))
    for name, kw in calls:
        kw = {k: v for k, v in kw.items() if k != "name"}
        result = run_op(OPERATIONS[name], facts=CLEAN, **kw)
        assert not result.changed, (name, result.commands)
        assert result.noops, name
