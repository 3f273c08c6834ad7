import re
from pathlib import Path

import pytest

from p40fleet.gpu_catalog import (
    CATALOG,
    CHIP_FAMILIES,
    chip_family,
    derive_model,
    lookup,
    parse_pci_id,
    resolve,
)
from p40fleet.profile import driver_supports, summarize_host

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"

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


# -- the cards old labs hold, and ids the catalog lacks ----------------------------------------


def _old_lab_cards() -> list[tuple[int, str]]:
    lines = (FIXTURES / "pciids-old-lab-cards-debian-2023.04.11.txt").read_text().splitlines()
    cards = []
    for line in lines:
        if m := re.match(r"^\t([0-9a-f]{4})  (.*)$", line):
            cards.append((int(m.group(1), 16), m.group(2)))
    return cards


def test_every_old_lab_card_is_in_the_catalog():
    cards = _old_lab_cards()
    assert len(cards) == 104
    unknown = [f"{i:04x} {name}" for i, name in cards if lookup(i) is None]
    assert unknown == []


@pytest.mark.parametrize(("pci_id", "pci_name"), _old_lab_cards())
def test_old_lab_card_matches_its_pciids_line(pci_id, pci_name):
    model = CATALOG[pci_id]
    assert pci_name.startswith(model.chip)
    assert pci_name.endswith(f"[{model.name}]")
    # the name alone would give the same answer (the fallback agrees with the table)
    derived = derive_model(pci_id, pci_name)
    assert derived is not None
    assert (derived.arch, derived.compute_capability) == (model.arch, model.compute_capability)


def test_catalog_chips_agree_with_the_chip_families():
    for model in CATALOG.values():
        family = chip_family(model.chip)
        assert family in CHIP_FAMILIES, model
        assert CHIP_FAMILIES[family] == (model.arch, model.compute_capability), model


@pytest.mark.parametrize(
    ("chip", "cc"),
    [
        ("GK104", (3, 0)),
        ("GK110", (3, 5)),
        ("GK110B", (3, 5)),
        ("GK210GL", (3, 7)),
        ("GK208B", (3, 5)),
        ("GM107", (5, 0)),
        ("GM108M", (5, 0)),
        ("GM200GL", (5, 2)),
        ("GM204", (5, 2)),
        ("GM206", (5, 2)),
        ("GP100GL", (6, 0)),
        ("GP102", (6, 1)),
        ("GP104GL", (6, 1)),
        ("GP106", (6, 1)),
        ("GP107", (6, 1)),
        ("GP108", (6, 1)),
        ("GV100", (7, 0)),
        ("TU102", (7, 5)),
        ("TU116", (7, 5)),
        ("TU117GL", (7, 5)),
        ("GA100", (8, 0)),
        ("GA102", (8, 6)),
        ("GA107GL", (8, 6)),
        ("AD102", (8, 9)),
        ("AD107", (8, 9)),
        ("GH100", (9, 0)),
        ("GB100", (10, 0)),
        ("GB202", (12, 0)),
        ("GF110", (2, 0)),
        ("GF119", (2, 1)),
    ],
)
def test_chip_family_capability(chip, cc):
    model = derive_model(0xFFFE, f"{chip} [Some Card]")
    assert model is not None
    assert model.compute_capability == cc


@pytest.mark.parametrize(
    ("pci_id", "pci_name", "name", "family", "cc"),
    [
        # real Debian pci.ids lines whose ids the catalog does not hold
        (0x1B39, "GP102GL [Tesla P10]", "Tesla P10", "GP102", (6, 1)),
        (0x1B84, "GP104 [GeForce GTX 1060 3GB]", "GeForce GTX 1060 3GB", "GP104", (6, 1)),
        (0x1E89, "TU104 [GeForce RTX 2060]", "GeForce RTX 2060", "TU104", (7, 5)),
        (0x2187, "TU116 [GeForce GTX 1650 SUPER]", "GeForce GTX 1650 SUPER", "TU116", (7, 5)),
        (0x1B70, "GP102GL", "GP102GL", "GP102", (6, 1)),
        (0x102E, "GK110BGL [Tesla K40d]", "Tesla K40d", "GK110", (3, 5)),
        (0x13F9, "GM204GLM [Quadro M4000M]", "Quadro M4000M", "GM204", (5, 2)),
        (0x2339, "GH100[H100 SXM5 80GB]", "H100 SXM5 80GB", "GH100", (9, 0)),  # no space
        (0x1080, "GF110 [GeForce GTX 580]", "GeForce GTX 580", "GF110", (2, 0)),
    ],
)
def test_resolve_from_pciids_name(pci_id, pci_name, name, family, cc):
    if pci_id in CATALOG:  # 2339 is in the catalog: the catalog wins, the name is not read
        assert resolve(pci_id, pci_name) is CATALOG[pci_id]
        pci_id = 0xFFFE
    assert lookup(pci_id) is None
    model = resolve(pci_id, pci_name)
    assert model is not None
    assert model.name == name
    assert model.compute_capability == cc
    assert model.memory_gib is None
    assert model.derived_from == f"cc from chip family {family} in pci.ids name"


def test_catalog_wins_over_the_name():
    assert resolve(0x1B38, "GK104 [not what it is]") is CATALOG[0x1B38]
    assert resolve("10de:1b38").derived_from is None


@pytest.mark.parametrize(
    ("pci_id", "pci_name"),
    [
        (0x0008, "NV1 [STG2000X-B Series]"),  # a family the table has no capability for
        (0x1EB9, "Device 1eb9"),  # an old pci.ids names it by number only
        (0xFFFE, None),  # no pci.ids on the host
        (0xFFFE, ""),
        (0xFFFE, "[GeForce GTX 1080 Ti]"),  # a product name is not a chip family
        (0xFFFE, "GA10B [Jetson Orin]"),  # Tegra: not a PCI GPU family
    ],
)
def test_neither_knows(pci_id, pci_name):
    assert resolve(pci_id, pci_name) is None


def test_non_nvidia_vendor_is_never_derived():
    assert resolve("8086:1b39", "GP102GL [Tesla P10]") is None


def test_lspci_lines():
    p40 = (FIXTURES / "tesla-p40-lspci-nn-kubevirt-gpu-device-plugin.txt").read_text()
    name = re.search(r"NVIDIA Corporation (.*) \[10de:", p40).group(1)
    assert name == "GP102GL [Tesla P40]"
    assert chip_family(name) == "GP102"
    assert chip_family(p40.split(": ", 1)[1]) == "GP102"  # "NVIDIA Corporation GP102GL [...]"
    t4 = (FIXTURES / "tesla-t4-unnamed-device-1eb8-old-pciids-deepracer.txt").read_text()
    assert chip_family(t4.split(": ", 1)[1]) is None  # "NVIDIA Corporation Device 1eb8"
    # the catalog still knows the T4 by number when the host's pci.ids does not name it
    assert resolve(0x1EB8, "Device 1eb8").name == "Tesla T4"


def test_derived_gpus_in_a_host_summary():
    p10 = resolve(0x1B39, "GP102GL [Tesla P10]")

    class Gpu:
        def __init__(self, device_id, model, pci_name=None):
            self.device_id, self.model, self.pci_name = device_id, model, pci_name

    summary = summarize_host([Gpu(0x1B38, CATALOG[0x1B38]), Gpu(0x1B39, p10)])
    assert summary.ok and summary.profile == "pascal"
    assert "1× Tesla P10 (cc from chip family GP102 in pci.ids name)" in summary.models
    kepler = summarize_host([Gpu(0x102E, resolve(0x102E, "GK110BGL [Tesla K40d]"))])
    assert kepler.refused.startswith("compute capability 3.5 < 5.0")
    nv1 = summarize_host([Gpu(0x0008, None, "NV1 [STG2000X-B Series]")])
    assert "10de:0008 (pci.ids: 'NV1 [STG2000X-B Series]')" in nv1.refused
    assert "add it to the catalog" in nv1.refused


def test_driver_support_for_derived_models():
    ok, why = driver_supports("525", resolve(0x1B39, "GP102GL [Tesla P10]"))
    assert ok and "cc from chip family GP102" in why
    # Hopper and Ada gained ids after R525: an id known only by its family is not assumed
    ok, why = driver_supports("525", resolve(0x2336, "GH100 [H200 NVL]"))
    assert not ok and "10de:2336" in why and "supported-chips" in why
