from dataclasses import dataclass

import pytest

from p40fleet.gpu_catalog import lookup
from p40fleet.profile import (
    driver_branch,
    driver_supports,
    profile_for,
    refusal_reason,
    summarize_host,
)


@pytest.mark.parametrize(
    ("cc", "profile"),
    [
        ((3, 7), "refused"),
        ((3, 5), "refused"),
        ((5, 2), "refused"),
        ((6, 0), "pascal"),
        ((6, 1), "pascal"),
        ((7, 0), "volta-turing"),
        ((7, 5), "volta-turing"),
        ((8, 0), "ampere-plus"),
        ((8, 9), "ampere-plus"),
        ((9, 0), "ampere-plus"),
        ((12, 0), "ampere-plus"),
    ],
)
def test_profile_for(cc, profile):
    assert profile_for(cc) == profile
    assert (refusal_reason(cc) is None) == (profile != "refused")


def test_maxwell_override():
    assert "allow_maxwell" in refusal_reason((5, 2))
    assert profile_for((5, 2), allow_maxwell=True) == "pascal"
    assert profile_for((3, 7), allow_maxwell=True) == "refused"


def test_driver_branch_forms():
    assert driver_branch("525") == "525"
    assert driver_branch("R525") == "525"
    assert driver_branch("525.147.05") == "525"
    assert driver_branch("latest") is None


@pytest.mark.parametrize(
    ("pci_id", "ok"),
    [
        ("1b38", True),  # P40
        ("17fd", True),  # M40: R525 supports Maxwell
        ("1db4", True),
        ("1eb8", True),
        ("20b0", True),
        ("2684", True),
        ("2330", True),  # H100 SXM5
        ("2331", True),
        ("2335", False),  # H200
        ("2342", False),  # GH200
        ("2901", False),  # B200
        ("2b85", False),  # RTX 5090
        ("102d", False),  # K80: Kepler ended with R470
    ],
)
def test_driver_supports_525(pci_id, ok):
    supported, reason = driver_supports("525", lookup(pci_id))
    assert supported is ok
    assert ("does not support" in reason) is not ok


def test_driver_supports_unknowns():
    assert driver_supports("525", None)[0] is False
    ok, reason = driver_supports("999", lookup("1b38"))
    assert not ok and "999" in reason
    assert driver_supports("470.182.03", lookup("102d"))[0] is True


def test_summary_p40x4():
    s = summarize_host([0x1B38] * 4)
    assert s.ok and s.verdict == "ready"
    assert s.models == ("4× Tesla P40",)
    assert s.gpus_str == "4× Tesla P40"
    assert s.gpu_count == 4
    assert s.lowest_capability == (6, 1)
    assert s.capability_str == "6.1"
    assert s.profile == "pascal"
    assert s.driver_branch == "525"
    assert s.driver_supported is True
    assert s.unknown_ids == ()


def test_summary_mixed_takes_lowest():
    s = summarize_host([0x2204, 0x1B38, 0x1B38, 0x1B38])
    assert s.profile == "pascal"
    assert set(s.models) == {"3× Tesla P40", "1× GeForce RTX 3090"}
    assert s.ok


def test_summary_no_gpu():
    s = summarize_host([])
    assert s.verdict == "refused: no NVIDIA GPU found"
    assert s.profile is None and s.driver_supported is False
    assert s.gpus_str == "none" and s.capability_str == "-"


def test_summary_h200_refused_by_driver():
    s = summarize_host([0x2335])
    assert s.profile == "ampere-plus"
    assert not s.driver_supported
    assert s.verdict.startswith("refused: driver R525 does not support H200")


def test_summary_kepler_refused():
    s = summarize_host([0x102D, 0x102D])
    assert s.profile == "refused"
    assert "3.7" in s.refused


def test_summary_unknown_id():
    s = summarize_host([0x1B38, 0xFFFF])
    assert s.unknown_ids == (0xFFFF,)
    assert not s.ok and "10de:ffff" in s.refused
    assert "1× unknown 10de:ffff" in s.models


def test_summary_accepts_objects():
    @dataclass
    class Fn:
        device_id: int

    s = summarize_host([Fn(0x1EB8)], branch="525.147.05")
    assert s.profile == "volta-turing" and s.ok
    with pytest.raises(TypeError):
        summarize_host(["1b38"])


def test_summary_maxwell_policy():
    assert not summarize_host([0x17FD]).ok
    assert summarize_host([0x17FD], allow_maxwell=True).ok
