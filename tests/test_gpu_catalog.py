import re
from pathlib import Path

import pytest

from p40fleet.gpu_catalog import CATALOG, lookup, parse_pci_id

PCI_IDS = Path("/usr/share/misc/pci.ids")
# Absent from Debian bookworm's pci.ids (2023.04.11); named from later releases.
NEWER_THAN_BOOKWORM = {0x26B9, 0x2335, 0x2342, 0x2901, 0x2B85}


@pytest.mark.parametrize(
    "value", ["1b38", "0x1b38", "1B38", "10de:1b38", "10DE:1B38", "0x1B3810DE", "0x1b3810de"]
)
def test_lookup_forms_of_the_p40(value):
    model = lookup(value)
    assert model is not None
    assert model.name == "Tesla P40"
    assert model.compute_capability == (6, 1)
    assert model.arch == "Pascal"
    assert model.memory_gib == 24
    assert model.pci_id_hex == "10de:1b38"


def test_lookup_ints():
    assert lookup(0x1B38).name == "Tesla P40"
    assert lookup(0x233510DE).name == "H200 SXM 141GB"


@pytest.mark.parametrize("value", ["8086:1b38", "0x1b388086", "1002:1b38"])
def test_non_nvidia_vendor(value):
    assert lookup(value) is None


@pytest.mark.parametrize("value", ["", "zzzz", "P40", "10de:", ":1b38", "0x", "10de:1b38:1", "1.5"])
def test_garbage_is_none(value):
    assert parse_pci_id(value) is None
    assert lookup(value) is None


def test_unknown_device():
    assert lookup("10de:ffff") is None


@pytest.mark.parametrize(
    ("pci_id", "cc"),
    [
        (0x102D, (3, 7)),
        (0x1023, (3, 5)),
        (0x17FD, (5, 2)),
        (0x13F2, (5, 2)),
        (0x15F8, (6, 0)),
        (0x1BB3, (6, 1)),
        (0x1DB4, (7, 0)),
        (0x1EB8, (7, 5)),
        (0x20B0, (8, 0)),
        (0x2204, (8, 6)),
        (0x26B9, (8, 9)),
        (0x2330, (9, 0)),
        (0x2335, (9, 0)),
        (0x2901, (10, 0)),
        (0x2B85, (12, 0)),
    ],
)
def test_capabilities(pci_id, cc):
    assert CATALOG[pci_id].compute_capability == cc


def test_capability_matches_arch():
    ranges = {
        "Kepler": {3},
        "Maxwell": {5},
        "Pascal": {6},
        "Volta": {7},
        "Turing": {7},
        "Ampere": {8},
        "Ada Lovelace": {8},
        "Hopper": {9},
        "Blackwell": {10, 12},
    }
    for model in CATALOG.values():
        assert model.compute_capability[0] in ranges[model.arch], model


def test_catalog_covers_the_brief():
    wanted = (
        "102d 1023 1024 17fd 13f2 1431 15f7 15f8 15f9 1b38 1bb3 1db1 1db4 1db5 1db6 1df6 "
        "1eb8 20b0 20b2 20b5 20f1 20f3 20b7 2236 2235 27b8 26b5 26b9 2330 2331 2339 2335 "
        "2342 2901 1b80 1b06 1b81 1c03 1b00 1b02 1d81 1e82 1e04 1e02 1b30 1e30 2204 2206 "
        "2484 2230 2684 2704 26b1 2b85"
    )
    missing = [i for i in wanted.split() if int(i, 16) not in CATALOG]
    assert not missing


def _pciids_nvidia() -> dict[int, str]:
    names, in_nvidia = {}, False
    for line in PCI_IDS.read_text(encoding="utf-8", errors="replace").splitlines():
        if re.match(r"^[0-9a-f]{4} ", line):
            in_nvidia = line.startswith("10de ")
        elif in_nvidia and (m := re.match(r"^\t([0-9a-f]{4})  (.*)$", line)):
            names[int(m.group(1), 16)] = m.group(2)
    return names


@pytest.mark.skipif(not PCI_IDS.exists(), reason="pci.ids not installed (apt: pci.ids)")
def test_names_match_pciids():
    names = _pciids_nvidia()
    for pci_id, model in CATALOG.items():
        if pci_id in NEWER_THAN_BOOKWORM and pci_id not in names:
            continue
        entry = names.get(pci_id)
        assert entry is not None, f"{pci_id:04x} not in pci.ids"
        assert entry.startswith(model.chip), (entry, model)
        assert entry.endswith(f"[{model.name}]"), (entry, model)
