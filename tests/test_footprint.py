"""docs/footprint.md is p40fleet/footprint.py's own table, and its paths are the operations'."""

from __future__ import annotations

import re

import pytest

from p40fleet import footprint
from p40fleet.facts import mirror as mirror_facts
from p40fleet.operations import cuda, driver, mirror, nouveau, uninstall
from p40fleet.spec import StackSpec, load_spec
from p40fleet.spec.errors import SpecError


def test_docs_footprint_is_generated_from_the_declared_list():
    assert footprint.DOC.read_text() == footprint.render(), (
        "docs/footprint.md is out of date: run `python -m p40fleet.footprint --write`"
    )


def test_the_table_has_one_row_per_item_with_the_spec_defaults():
    doc = footprint.DOC.read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) - 1 == len(footprint.FOOTPRINT) == int(re.search(r"(\d+) rows", doc)[1])
    spec = StackSpec()
    for path in (spec.paths.cuda_dir, spec.paths.cuda_link, spec.user.home, "/etc/p40fleet",
                 "/etc/apt/p40fleet-aside", "/var/lib/p40fleet/run.lock"):  # fmt: skip
        assert f"`{path}`" in doc, path
    assert "(`stack.paths.cuda_dir`)" in doc and "`stack.policy.uninstall_home: keep`" in doc


def test_the_footprint_paths_are_the_ones_the_operations_write():
    assert footprint.BLACKLIST_FILE == nouveau.BLACKLIST_FILE
    assert footprint.PROFILE_FILE == cuda.PROFILE_FILE
    assert footprint.MIRROR_LIST == mirror_facts.MIRROR_LIST
    assert footprint.ASIDE_DIR == mirror_facts.ASIDE_DIR
    keys = {mirror.key_dest("k.gpg"), mirror.key_dest("k.asc")}
    assert set(footprint.MIRROR_KEYS) == keys
    assert footprint.BUILD_PACKAGES == driver.BUILD_PACKAGES


def test_every_kind_of_undo_has_its_operation_and_its_place_in_the_order():
    kinds = {item.undo for item in footprint.FOOTPRINT}
    assert kinds <= set(footprint.UNDO_KINDS) == set(uninstall.ORDER)
    assert set(uninstall.ORDER) - set(uninstall.NOT_OPERATIONS) <= kinds  # no dead handler


def test_an_item_of_an_unknown_kind_is_an_error_not_a_silent_skip():
    item = footprint.Item("a new thing", "/etc/new", "system: new", "teleport")
    with pytest.raises(ValueError, match="no operation undoes 'teleport'"):
        uninstall.undo(item, StackSpec())


def test_paths_follow_the_spec():
    spec = load_spec("lab1", {"paths": {"cuda_dir": "/opt/cuda-11.8", "cuda_link": "/opt/cuda"},
                              "user": {"name": "trainer", "home": "/srv/trainer"}})  # fmt: skip
    where = {item.undo + ":" + item.what[:10]: item.path(spec) for item in footprint.FOOTPRINT}
    assert where["cuda_link:CUDA symli"] == "/opt/cuda"
    assert "/srv/trainer" in where.values() and "/opt/cuda-11.8" in where.values()


def test_uninstall_home_is_validated_and_kept_by_default():
    assert StackSpec().policy.uninstall_home == "keep"
    assert load_spec("lab1", {"policy": {"uninstall_home": "remove"}}).policy.uninstall_home == (
        "remove"
    )
    with pytest.raises(SpecError, match="uninstall_home"):
        load_spec("lab1", {"policy": {"uninstall_home": "wipe"}})
