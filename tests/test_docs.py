"""README.md stays an admin's document: short, its links and the docs' links resolve, its two
pictures are the ones ``python -m p40fleet.pictures`` draws from the repository's data."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from p40fleet import pictures

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SVG = "{http://www.w3.org/2000/svg}"
#: [text](target) and ![alt](target); a target ends at whitespace or the closing parenthesis
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _documents() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", doc.read_text())
    return {_slug(m[1]) for m in re.finditer(r"(?m)^#{1,6}\s+(.*)$", text)}


def links(doc: Path) -> list[str]:
    """The relative links of a markdown file (code blocks and inline code left out)."""
    text = re.sub(r"(?ms)^```.*?^```", "", doc.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    return [m[1] for m in _LINK.finditer(text) if not re.match(r"[a-z][a-z0-9+.-]*:", m[1], re.I)]


def test_readme_is_at_most_260_lines():
    lines = README.read_text().count("\n")
    assert lines <= 260, f"README.md has {lines} lines: move detail into docs/ and link it"


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_an_existing_file(doc):
    broken = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        if not where.exists():
            broken.append(f"{target}: no file {where}")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(f"{target}: {where.name} has no heading #{anchor}")
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"


def test_the_link_check_sees_links_and_catches_a_broken_one(tmp_path):
    """The check itself: it finds README's links and flags a missing file and anchor."""
    assert "docs/runbook.md" in links(README) and "docs/pictures/layers.svg" in links(README)
    doc = tmp_path / "x.md"
    doc.write_text(
        "# Top\n\n[a](nope.md) [b](x.md#top) [c](x.md#gone) `[d](no.md)` [e](https://x)\n"
    )
    assert links(doc) == ["nope.md", "x.md#top", "x.md#gone"]
    assert _slug("After an OS reinstall") in _anchors(REPO / "docs" / "runbook.md")
    assert "gone" not in _anchors(doc) and "top" in _anchors(doc)


def test_readme_links_every_docs_file_and_shows_both_pictures():
    targets = set(links(README))
    for doc in sorted((REPO / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in targets, f"README.md does not link docs/{doc.name}"
    text = README.read_text()
    assert "](docs/pictures/layers.svg)" in text and "](docs/pictures/gpu-memory.svg)" in text
    assert text.count("![") >= 2


def test_committed_pictures_are_the_generated_ones():
    for path, text in pictures.pictures().items():
        assert path.read_text() == text, (
            f"{path.relative_to(REPO)} is out of date: run `python -m p40fleet.pictures --write`"
        )


def _svg(name: str) -> ET.Element:
    return ET.parse(REPO / "docs" / "pictures" / name).getroot()


def test_the_memory_plot_has_one_point_per_measurement_with_its_numbers():
    runs = sorted((REPO / "docs" / "measurements").glob("ppo-*.json"))
    assert len(runs) >= 4
    points = {
        g.get("data-file"): g
        for g in _svg("gpu-memory.svg").iter(f"{SVG}g")
        if g.get("class") == "measurement"
    }
    assert sorted(points) == [p.name for p in runs]
    for path in runs:
        run = json.loads(path.read_text())
        g = points[path.name]
        measured = max(gpu["max_allocated_gib"] for gpu in run["peak_per_gpu"])
        assert float(g.get("data-measured-gib")) == pytest.approx(measured, abs=5e-4)
        estimate = run["estimate"]["per_gpu_gib"]
        if estimate is None:
            assert g.get("data-estimate-gib") == ""
        else:
            assert float(g.get("data-estimate-gib")) == pytest.approx(estimate, abs=1e-5)
            versus = run["estimate_vs_measured"]
            assert versus["estimate_gib"] == pytest.approx(estimate)
            assert versus["measured_max_allocated_gib"] == pytest.approx(measured, abs=5e-4)
        title = g.find(f"{SVG}title").text
        assert title.startswith(f"{path.name}: measured {measured:.3f} GiB"), title


def test_the_memory_plot_shows_todays_estimate_for_the_unforced_plans():
    """Today's estimates are the ones tests/test_memory.py holds (22.2 GiB for a 1x P40)."""
    today = {
        g.get("data-file"): float(g.get("data-estimate-gib"))
        for g in _svg("gpu-memory.svg").iter(f"{SVG}g")
        if g.get("class") == "today"
    }
    assert set(today) == {"ppo-1xP40.json", "ppo-2xP40.json", "ppo-1xP100.json"}
    assert round(today["ppo-1xP40.json"], 1) == 22.2
    assert round(today["ppo-2xP40.json"], 1) == 16.6 and round(today["ppo-1xP100.json"], 1) == 12.9


def test_the_layer_diagram_shows_the_layers_in_order_and_ray():
    root = _svg("layers.svg")
    layers = [g.get("data-layer") for g in root.iter(f"{SVG}g") if g.get("class") == "layer"]
    assert layers == ["preflight", "system", "python", "training", "verify", "ray"]
    words = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    for name in ("deploy/preflight.py", "deploy/system.py", "deploy/python.py",
                 "deploy/training.py", "deploy/verify.py", "deploy/ray.py"):  # fmt: skip
        assert name in words and (REPO / name).is_file(), name


def test_license_is_apache_2_and_pyproject_names_it():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("Copyright 2026 the p40fleet authors\n")
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply" in text
    assert 'license = { file = "LICENSE" }' in (REPO / "pyproject.toml").read_text()
