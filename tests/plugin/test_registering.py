"""Tests of ``metrale_core.plugin.registering``: a registration hook written as data."""

from __future__ import annotations

import types

import pytest

from metrale_core.api import ExecutorSpec, lazy_factory, load_registry, registers
from metrale_core.plugin.registry import new_plugin_manager


def _spec(name: str) -> ExecutorSpec:
    return ExecutorSpec(name=name, factory=lazy_factory("x.y:Z"), description=f"executor {name}")


def test_registers_passes_each_record_once_in_order():
    first, second = _spec("a"), _spec("b")
    hook = registers(first, second)
    seen: list[object] = []
    hook(seen.append)
    assert seen == [first, second]
    hook(seen.append)  # each call registers them again: the hook keeps no state
    assert seen == [first, second, first, second]
    assert "'a'" in (hook.__doc__ or "") and "'b'" in (hook.__doc__ or "")


def test_registers_needs_a_record():
    with pytest.raises(ValueError, match="at least one"):
        registers()


def test_a_module_attribute_made_by_registers_is_a_hook_implementation():
    plugin = types.ModuleType("fake_plugin")
    plugin.metrale_executors = registers(_spec("fake-exec"))  # type: ignore[attr-defined]
    pm = new_plugin_manager()
    pm.register(plugin, name="fake")
    assert [impl.plugin_name for impl in pm.hook.metrale_executors.get_hookimpls()] == ["fake"]
    registered: list[object] = []
    pm.hook.metrale_executors(register=registered.append)
    assert [spec.name for spec in registered] == ["fake-exec"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("family", "name", "origin"),
    [
        ("model_loaders", "qwen3", "qwen3"),
        ("model_loaders", "llama", "qwen3"),
        ("model_loaders", "olmo2", "olmo2"),
        ("model_loaders", "gemma2", "gemma2"),
        ("model_loaders", "deepseek3", "deepseek2"),
        ("model_loaders", "glm5_next", "glm_kda"),
        ("executors", "ray", "ray"),
        ("kv_scale_sources", "fp8", "fp8"),
        ("logit_processors", "b1-margin", "b1"),
        ("logit_processors", "structured-output", "structured"),
    ],
)
def test_in_tree_plugins_written_with_it_register_their_components(family, name, origin):
    registry = load_registry()
    assert name in getattr(registry, family)
    assert registry.origins[family, name] == origin
