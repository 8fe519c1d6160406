"""``metrale_core.api``: every public name resolves, importing it is light, and plugins use it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import metrale_core.api as api


def test_every_public_name_resolves_to_its_module_object():
    for name, module in api.PUBLIC.items():
        value = getattr(api, name)
        assert value is getattr(sys.modules[module], name), name
        assert name in api.__all__


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="no public name '_inverse_cdf'"):
        api._inverse_cdf  # noqa: B018
    assert "build_linear" in dir(api)


def test_importing_the_api_imports_no_torch():
    code = "import sys, metrale_core.api; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_public_sampling_helper_is_the_samplers_own():
    import torch

    probs = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    assert api.inverse_cdf(probs, torch.tensor([0.75, 0.3])).tolist() == [2, 0]


def test_the_type_checking_block_mirrors_the_lazy_table():
    """``if TYPE_CHECKING:`` in api.py imports exactly :data:`PUBLIC` (name -> module), so static
    checkers see the names a plugin gets at run time, and no more."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(api.__file__).read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    assert len(blocks) == 1
    imported: dict[str, str] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None, ast.unparse(node)
        for alias in node.names:
            assert alias.asname in (None, alias.name) and alias.name not in imported, alias.name
            imported[alias.name] = node.module
    assert imported == api.PUBLIC
