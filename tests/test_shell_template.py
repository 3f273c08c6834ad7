"""p40fleet.shell_template: the one jinja environment of the project's shell scripts."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import jinja2
import pytest

from p40fleet.shell_template import shell_template

REPO = Path(__file__).resolve().parent.parent


def test_unknown_names_fail_and_values_quote_as_one_shell_word(tmp_path):
    path = tmp_path / "t.sh.j2"
    path.write_text("echo {{ word | q }} <&>\n")
    word = "a b'c; rm -rf /"
    text = shell_template(path).render(word=word)
    assert text == f"echo {shlex.quote(word)} <&>\n"  # no HTML escaping, newline kept
    assert shlex.split(text.split("<")[0]) == ["echo", word]
    with pytest.raises(jinja2.UndefinedError):
        shell_template(path).render()


def test_no_other_jinja_environment_in_the_project():
    """Scripts render through shell_template; a second Environment would drift from it."""
    found = []
    for folder in ("deploy", "facts", "operations", "p40fleet", "p40lab"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                if call and node.func.attr == "Environment":
                    found.append(str(path.relative_to(REPO)))
    assert found == ["p40fleet/shell_template.py"], found
