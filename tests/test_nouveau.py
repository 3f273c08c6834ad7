"""operations.nouveau and facts.nouveau: blacklist, initramfs freshness, reboot or refuse."""

from __future__ import annotations

from pyinfra.facts.server import Which

from p40fleet.facts.nouveau import FileStamp, FileStampFact, InitramfsMtime, NouveauLoaded
from p40fleet.operations import nouveau
from tests.opharness import at, run_op
from tests.probe_answers import KERNEL, checks_for, only_failures, sections

CONF = "/etc/modprobe.d/blacklist-nouveau.conf"
GOOD = FileStamp(mtime=1000, text="blacklist nouveau\noptions nouveau modeset=0\n")


def test_blacklist_written_when_absent():
    r = run_op(nouveau.blacklist, facts={at(FileStampFact, path=CONF): None})
    assert r.commands == [
        "mkdir -p /etc/modprobe.d && printf '%s\\n' 'blacklist nouveau' "
        f"'options nouveau modeset=0' > {CONF}"
    ]


def test_blacklist_rewritten_when_content_differs():
    old = FileStamp(mtime=1000, text="blacklist nouveau\n")
    r = run_op(nouveau.blacklist, facts={FileStampFact: old})
    assert len(r.commands) == 1 and "modeset=0" in r.commands[0]


def test_blacklist_same_content_is_a_noop():
    r = run_op(nouveau.blacklist, facts={FileStampFact: GOOD})
    assert r.commands == [] and r.noops


def test_initramfs_updated_when_blacklist_is_newer():
    r = run_op(
        nouveau.initramfs,
        facts={FileStampFact: GOOD, InitramfsMtime: 999, Which: "/usr/sbin/update-initramfs"},
    )
    assert r.commands == ["update-initramfs -u"]


def test_initramfs_updated_when_there_is_none_yet():
    r = run_op(
        nouveau.initramfs,
        facts={FileStampFact: GOOD, InitramfsMtime: None, Which: "/usr/sbin/update-initramfs"},
    )
    assert r.commands == ["update-initramfs -u"]


def test_initramfs_newer_than_blacklist_is_a_noop():
    r = run_op(nouveau.initramfs, facts={FileStampFact: GOOD, InitramfsMtime: 1000})
    assert r.commands == [] and r.noops


def test_initramfs_without_update_initramfs_refuses():
    r = run_op(nouveau.initramfs, facts={FileStampFact: GOOD, InitramfsMtime: 1, Which: None})
    assert r.commands == ["function _fail"]
    assert "initramfs-tools" in r.failures[0]


def test_not_loaded_is_a_noop():
    r = run_op(nouveau.unloaded, allow_reboot=True, facts={NouveauLoaded: False})
    assert r.commands == [] and r.noops == ["nouveau is not loaded"]


def test_loaded_without_allow_reboot_fails_this_host_with_the_remedy():
    r = run_op(nouveau.unloaded, allow_reboot=False, facts={NouveauLoaded: True})
    assert r.commands == ["function _fail"]
    (message,) = r.failures
    assert "reboot required: nouveau is loaded" in message
    assert "run with allow_reboot=True or reboot it yourself, then re-run" in message


def test_loaded_with_allow_reboot_reboots_with_short_delay_and_confirms():
    r = run_op(nouveau.unloaded, allow_reboot=True, facts={NouveauLoaded: True})
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in r.commands
    assert r.commands[-1] == "function _confirm_nouveau_gone"
    waits = [f for f in r.functions if f.function.__name__ == "wait"]
    assert waits and waits[0].function.__closure__ is not None
    cells = dict(
        zip(waits[0].function.__code__.co_freevars, waits[0].function.__closure__, strict=True)
    )
    assert cells["delay"].cell_contents == nouveau.REBOOT_DELAY_S == 2
    assert cells["reboot_timeout"].cell_contents == nouveau.REBOOT_TIMEOUT_S


# -- facts.nouveau ---------------------------------------------------------------------------


def test_nouveau_loaded():
    assert NouveauLoaded().process(["yes"]) is True
    assert NouveauLoaded().process(["no"]) is False
    assert "/sys/module/nouveau" in NouveauLoaded().command()


# --- verify's nouveau checks (p40fleet/verification/checks/nouveau.py) ------------------------


def test_nouveau_loaded_fails_verify():
    host = ["sim=no", f"kernel={KERNEL}", "nouveau=loaded", "@@rc 0"]
    checks = checks_for(sections(host=host))
    assert only_failures(checks) == {"nouveau"}
    assert "allow_reboot" in checks["nouveau"].remedy
