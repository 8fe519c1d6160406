"""``metrale_core.plugin.public_face``: the generated index and stub are current, and the
generator refuses a face that declares a name twice or names what its module lacks."""

from __future__ import annotations

import ast

import pytest

from metrale_core import api
from metrale_core.plugin import public_face


def test_the_generated_index_and_stub_are_current():
    files = public_face.render(public_face.resolve())
    stale = public_face.stale(files)
    assert not stale, f"stale: {[p.name for p in stale]}; regenerate with `{public_face.REGENERATE}`"
    assert public_face.main(["--check"]) == 0


def test_the_stub_imports_each_public_name_from_its_module():
    tree = ast.parse(public_face.STUB_PATH.read_text())
    imported = {
        alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module != "typing"
        for alias in node.names
        if alias.asname == alias.name
    }
    assert imported == api.PUBLIC


def test_stale_files_are_reported(tmp_path):
    target = tmp_path / "index.py"
    target.write_text("old")
    assert public_face.stale({target: "new", tmp_path / "missing.py": "x"}) == [target, tmp_path / "missing.py"]
    assert public_face.stale({target: "old"}) == []


def test_a_name_declared_twice_is_refused():
    face = {
        "author": {"metrale_core.plugin.components": ("LoadOptions",)},
        "expert": {"metrale_core.plugin.components": ("LoadOptions",)},
    }
    with pytest.raises(public_face.FaceError, match="'LoadOptions' is declared twice"):
        public_face.resolve(face)


def test_a_name_its_module_lacks_is_refused():
    with pytest.raises(public_face.FaceError, match="has no name 'NoSuchSpec'"):
        public_face.resolve({"author": {"metrale_core.plugin.components": ("NoSuchSpec",)}})


def test_all_expands_to_the_modules_all():
    names = public_face.resolve({"author": {"metrale_core.plugin.components": api.ALL}})
    import metrale_core.plugin.components as components

    assert [p.name for p in names] == sorted(components.__all__)
    assert {p.tier for p in names} == {"author"}
