"""``metrale_core.api``: every public name resolves, importing it is light, and plugins use it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


def test_every_public_name_is_in_one_tier_and_the_tiers_cover_the_face():
    assert set(api.TIER) == set(api.PUBLIC)
    assert set(api.TIER.values()) == set(api.TIERS) == {"author", "expert"}
    author, expert = api.names("author"), api.names("expert")
    assert not set(author) & set(expert)
    assert sorted(author + expert) == sorted(api.PUBLIC)
    assert "build_linear" in author and "SchedulingPolicy" in expert
    with pytest.raises(ValueError, match="unknown tier"):
        api.names("internal")


#: The in-tree plugins that define models: what they import from the API is the author tier.
MODEL_PLUGINS = ("metrale-qwen3", "metrale-gemma3", "metrale-glm-kda", "metrale-fp8", "metrale-b1")


def _api_names_used(package: Path) -> set[str]:
    used: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "metrale_core.api":
                used |= {alias.name for alias in node.names}
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "api":
                used.add(node.attr)
    return used


def test_model_plugins_use_only_the_author_tier():
    repo = Path(__file__).resolve().parents[1]
    for plugin in MODEL_PLUGINS:
        (package,) = [p for p in (repo / "plugins" / plugin).glob("metrale_*/") if (p / "__init__.py").is_file()]
        used = _api_names_used(package)
        assert used, plugin  # the scan finds the plugin's imports
        expert = sorted(name for name in used if api.TIER.get(name) == "expert")
        assert not expert, f"{plugin} uses expert-tier names {expert}"


def test_a_module_marked_all_contributes_its_whole_all():
    import metrale_core.plugin.components as components

    assert api.FACE["author"]["metrale_core.plugin.components"] == api.ALL
    assert {n for n, m in api.PUBLIC.items() if m == "metrale_core.plugin.components"} == set(components.__all__)
