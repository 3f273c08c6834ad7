"""docs/settings.md is the spec's own table: every setting, its default, the comment above it."""

from __future__ import annotations

from pydantic import BaseModel

from p40fleet.spec import table
from p40fleet.spec.pins import StackSpec


def test_docs_settings_is_generated_from_the_spec():
    assert table.DOC.read_text() == table.render(), (
        "docs/settings.md is out of date: run `python -m p40fleet.spec.table --write`"
    )


def test_the_table_lists_every_leaf_setting_with_its_real_default():
    rows = {path: default for path, default, _ in table.rows()}
    spec = StackSpec()
    assert rows["driver.version"] == f"`{spec.driver.version!r}`"
    assert rows["policy.dpkg_lock_wait_s"] == f"`{spec.policy.dpkg_lock_wait_s}`"
    assert rows["mirror"] == "unset" and "mirror.apt.url" in rows  # optional sections expanded
    assert rows["mirror.apt.url"].startswith("required")
    leaves = [p for p in rows if not any(q.startswith(p + ".") for q in rows)]
    assert len(leaves) >= 90, len(leaves)
    for path in leaves:  # every leaf is a real field path of the spec
        model = StackSpec
        for part in path.split("."):
            assert part in model.model_fields, path
            nested = table._models_in(model.model_fields[part].annotation)
            default = model.model_fields[part].get_default(call_default_factory=True)
            model = type(default) if isinstance(default, BaseModel) else (nested or [model])[0]
