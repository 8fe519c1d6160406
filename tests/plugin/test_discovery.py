"""Plugin loading (``metrale_core.plugin.discovery``), the registry and ``met plugins`` output.

Fake installed distributions are written as ``*.dist-info`` folders into a tmp dir on
``sys.path``, so entry-point discovery runs through ``importlib.metadata`` exactly as for a pip
install; their modules come from ``tests/data/fake_plugins/``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import shutil
import sys
from pathlib import Path

import pytest
from loguru import logger

from metrale_core.cli.plugins_cmd import format_plugins, plugins_json
from metrale_core.errors import (
    ConfigError,
    DuplicateComponent,
    PluginError,
    PluginImportError,
    UnknownArchitecture,
)
from metrale_core.plugin.discovery import LazyFactory, lazy_factory, load_registry

DATA = Path(__file__).resolve().parents[1] / "data" / "fake_plugins"
ENV_VARS = ("METRALE_PLUGINS", "METRALE_DISABLE_PLUGINS", "METRALE_STRICT_PLUGINS")
FAKEPLUG = {"good": "fake_good_plugin", "broken": "fake_broken_plugin", "blocked": "fake_blocked_plugin"}


def _purge_fake_modules() -> None:
    for name in [n for n in sys.modules if n.startswith("fake_") and n.endswith("_plugin")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def install(tmp_path, monkeypatch):
    """``install(dist, version, {entry_point: module})`` writes a fake installed distribution."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _purge_fake_modules()

    def install_dist(dist: str, version: str, entry_points: dict[str, str]) -> None:
        info = tmp_path / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = "".join(f"{name} = {module}\n" for name, module in entry_points.items())
        (info / "entry_points.txt").write_text("[metrale]\n" + lines)
        for module in entry_points.values():
            shutil.copy(DATA / f"{module}.py", tmp_path / f"{module}.py")
        importlib.invalidate_caches()

    yield install_dist
    _purge_fake_modules()
    importlib.invalidate_caches()


def fake_eps(*dists: str) -> list[importlib.metadata.EntryPoint]:
    """The ``metrale`` entry points importlib.metadata finds for the fake distributions ``dists``."""
    eps = [ep for ep in importlib.metadata.entry_points(group="metrale") if ep.dist.name in dists]
    assert eps, f"importlib.metadata does not see {dists}"
    return eps


@pytest.fixture
def warnings_log():
    messages: list[str] = []
    logger.enable("metrale_core")  # the package may disable its logs for library use
    handler = logger.add(lambda m: messages.append(m.record["message"]), level="WARNING")
    yield messages
    logger.remove(handler)


def info(reg, name):
    return next(p for p in reg.plugins if p.name == name)


def test_fake_distribution_registers_its_components(install, warnings_log):
    install("fakeplug", "1.0", FAKEPLUG)
    reg = load_registry(entry_points=fake_eps("fakeplug"))
    assert reg.samplers["fake-greedy"].factory() == "fake-greedy-sampler"
    assert reg.model_loaders["fakelm"].model_types == ("fakelm",)
    assert "blocked-sampler" in reg.samplers  # nothing blocks it here
    good = info(reg, "good")
    assert (good.distribution, good.version, good.status, good.error) == ("fakeplug", "1.0", "loaded", None)
    assert good.components == {"model_loaders": ["fakelm"], "samplers": ["fake-greedy"]}
    assert good.hooks == ("metrale_engine_flags", "metrale_model_loaders", "metrale_samplers")
    assert reg.provider("samplers", "fake-greedy") is good
    # built-ins are a plugin like any other, listed first
    assert reg.plugins[0].name == "builtins" and reg.plugins[0].distribution == "metrale-core"
    assert reg.plugins[0].components == {
        "logit_processors": ["reasoning-budget"],
        "samplers": ["default"],
        "schedulers": ["fcfs"],
        "tool_call_parsers": ["hermes", "qwen3_coder", "glm47", "mistral", "granite", "phi4_mini", "harmony"],
        "executors": ["uni", "mp", "env"],
        "kv_scale_sources": ["q8_0"],
    }


def test_import_error_warns_and_other_plugins_still_load(install, warnings_log):
    install("fakeplug", "1.0", FAKEPLUG)
    reg = load_registry(entry_points=fake_eps("fakeplug"))
    [warning] = [m for m in warnings_log if "'broken'" in m]
    assert "fakeplug" in warning and "needs libfoo" in warning and "ImportError" in warning
    broken = info(reg, "broken")
    assert broken.status == "failed" and broken.components == {}
    assert broken.error == "ImportError: fake_broken_plugin needs libfoo, which is not installed"
    assert "fake-greedy" in reg.samplers and "default" in reg.samplers


def test_strict_mode_raises_plugin_import_error(install, monkeypatch):
    install("fakeplug", "1.0", FAKEPLUG)
    monkeypatch.setenv("METRALE_STRICT_PLUGINS", "1")
    with pytest.raises(PluginImportError, match=r"'broken' from fakeplug 1\.0.*needs libfoo"):
        load_registry(entry_points=fake_eps("fakeplug"))


def test_disabled_plugins_are_never_imported(install, monkeypatch, warnings_log):
    install("fakeplug", "1.0", FAKEPLUG)
    monkeypatch.setenv("METRALE_DISABLE_PLUGINS", "blocked, broken")
    reg = load_registry(entry_points=fake_eps("fakeplug"))
    assert "fake_blocked_plugin" not in sys.modules and "fake_broken_plugin" not in sys.modules
    assert "blocked-sampler" not in reg.samplers and "fake-greedy" in reg.samplers
    assert info(reg, "blocked").status == "blocked" and info(reg, "broken").status == "blocked"
    assert reg.pm.is_blocked("blocked")
    assert warnings_log == []


def test_allow_list_loads_only_the_named_external_plugins(install, monkeypatch):
    install("fakeplug", "1.0", FAKEPLUG)
    monkeypatch.setenv("METRALE_PLUGINS", "good")
    reg = load_registry()  # real discovery: the fake distribution and every installed plugin
    assert {p.name for p in reg.plugins if p.status == "loaded"} == {"builtins", "good"}
    assert info(reg, "qwen3").status == "skipped" and info(reg, "blocked").status == "skipped"
    assert "fake_blocked_plugin" not in sys.modules
    assert set(reg.samplers) == {"default", "fake-greedy"}


def test_empty_allow_list_loads_only_builtins(install, monkeypatch):
    install("fakeplug", "1.0", FAKEPLUG)
    monkeypatch.setenv("METRALE_PLUGINS", "")
    reg = load_registry()
    assert [p.name for p in reg.plugins if p.status == "loaded"] == ["builtins"]


def test_duplicate_component_names_both_distributions(install):
    install("fakeplug", "1.0", {"good": "fake_good_plugin"})
    install("otherplug", "2.0", {"dup": "fake_dup_plugin"})
    with pytest.raises(DuplicateComponent, match=r"sampler 'fake-greedy' is registered by both") as err:
        load_registry(entry_points=fake_eps("fakeplug", "otherplug"))
    assert "fakeplug (plugin 'good')" in str(err.value) and "otherplug (plugin 'dup')" in str(err.value)


def test_two_plugins_with_one_entry_point_name_are_refused(install):
    install("fakeplug", "1.0", {"good": "fake_good_plugin"})
    install("otherplug", "2.0", {"good": "fake_dup_plugin"})
    with pytest.raises(PluginError, match=r"two plugins are named 'good'"):
        load_registry(entry_points=fake_eps("fakeplug", "otherplug"))


def test_misspelled_hookimpl_fails_check_pending(install):
    install("typoplug", "0.3", {"typo": "fake_typo_plugin"})
    with pytest.raises(PluginError) as err:
        load_registry(entry_points=fake_eps("typoplug"))
    message = str(err.value)
    assert "'typo' (typoplug 0.3)" in message
    assert "unknown hook 'metrale_sampler'" in message and "did you mean 'metrale_samplers'" in message


def test_failing_registration_hook_contributes_nothing(install, warnings_log):
    install("fakeplug", "1.0", {"good": "fake_good_plugin", "raising": "fake_raising_plugin"})
    reg = load_registry(entry_points=fake_eps("fakeplug"))
    assert "half-registered" not in reg.schedulers and "fcfs" in reg.schedulers
    raising = info(reg, "raising")
    assert raising.status == "failed" and "lost its configuration" in raising.error
    assert any("'raising'" in m and "lost its configuration" in m for m in warnings_log)
    assert reg.pm.get_plugin("raising") is None  # unregistered: no later hook reaches it
    assert "fake-greedy" in reg.samplers


def test_wrong_record_type_is_a_plugin_error(install):
    install("wrongplug", "1.0", {"wrong": "fake_wrongtype_plugin"})
    with pytest.raises(PluginError, match=r"'wrong'.*expected a SamplerSpec"):
        load_registry(entry_points=fake_eps("wrongplug"))


def test_installed_qwen3_plugin_is_listed():
    reg = load_registry()
    qwen3 = info(reg, "qwen3")
    assert qwen3.distribution == "metrale-qwen3"
    assert qwen3.version == importlib.metadata.version("metrale-qwen3")
    assert not any(p.distribution == "fakeplug" for p in reg.plugins)  # no leak from other tests


def test_builtins_use_lazy_factories():
    reg = load_registry(entry_points=[])
    assert reg.samplers["default"].factory == LazyFactory("metrale_core.sampling.sampler:DefaultSampler")
    assert reg.schedulers["fcfs"].factory == LazyFactory("metrale_core.engine.policy:FcfsPolicy")
    assert reg.provider("schedulers", "fcfs").distribution == "metrale-core"


def test_lazy_factory_imports_only_when_called():
    factory = lazy_factory("fake_lazy_target_module:make")  # does not exist: creating is fine
    with pytest.raises(ModuleNotFoundError, match="fake_lazy_target_module"):
        factory()
    assert lazy_factory("collections:OrderedDict")([("a", 1)]) == {"a": 1}
    with pytest.raises(ValueError, match=r"package.module:attr"):
        lazy_factory("collections.OrderedDict")


def test_builtins_can_be_disabled_like_any_plugin(monkeypatch):
    monkeypatch.setenv("METRALE_DISABLE_PLUGINS", "builtins")
    reg = load_registry(entry_points=[])
    assert reg.samplers == {} and reg.plugins[0].status == "blocked"


def test_find_model_loader_by_model_type_then_architectures(install):
    install("fakeplug", "1.0", {"good": "fake_good_plugin"})
    reg = load_registry(entry_points=fake_eps("fakeplug"))
    fakelm = reg.model_loaders["fakelm"]
    assert reg.find_model_loader({"model_type": "fakelm"}) is fakelm
    assert reg.find_model_loader({"model_type": "other", "architectures": ["X", "FakeLMModel"]}) is fakelm
    with pytest.raises(UnknownArchitecture) as err:
        reg.find_model_loader({"model_type": "mamba9", "architectures": ["Mamba9ForCausalLM"]})
    message = str(err.value)
    assert isinstance(err.value, ConfigError) and "\n" not in message
    assert message.startswith("model_type 'mamba9' (architectures: Mamba9ForCausalLM) is not supported; ")
    assert "supported architectures: FakeLMForCausalLM, FakeLMModel; model types: fakelm (install" in message
    with pytest.raises(UnknownArchitecture, match=r"^GGUF architecture 'mamba' is not supported; "):
        reg.find_model_loader({"model_type": "mamba"}, gguf_architectures={"mamba": "MambaForCausalLM"})
    # the GGUF line lists the mapped archs a loader serves, by model_type or by HF architecture
    with pytest.raises(UnknownArchitecture, match=r"supported GGUF architectures: fake, fakelm \(install"):
        reg.find_model_loader(
            {"model_type": "x"}, gguf_architectures={"fakelm": "-", "fake": "FakeLMModel", "no": "NoLM"}
        )


def test_get_names_the_installed_choices():
    reg = load_registry(entry_points=[])
    assert reg.get("samplers", "default") is reg.samplers["default"]
    with pytest.raises(ConfigError, match=r"unknown sampler 'nucleus'; installed: default \(metrale-core\)"):
        reg.get("samplers", "nucleus")


def test_plugins_add_engine_flags(install):
    install("fakeplug", "1.0", {"good": "fake_good_plugin"})
    reg = load_registry(entry_points=fake_eps("fakeplug"))
    parser = argparse.ArgumentParser()
    reg.add_engine_flags(parser.add_argument_group("engine options"))
    assert parser.parse_args(["--fake-flag", "3"]).fake_flag == 3
    assert parser.parse_args([]).fake_flag == 7

    clashing = argparse.ArgumentParser()
    clashing.add_argument("--fake-flag")
    with pytest.raises(PluginError, match=r"plugin 'good' failed to add its engine flags.*--fake-flag"):
        reg.add_engine_flags(clashing)


def test_format_plugins_lists_names_versions_components_and_errors(install, monkeypatch):
    install("fakeplug", "1.0", FAKEPLUG)
    monkeypatch.setenv("METRALE_DISABLE_PLUGINS", "blocked")
    reg = load_registry(entry_points=fake_eps("fakeplug"))
    text = format_plugins(reg)
    lines = text.splitlines()
    good_row = next(line for line in lines if line.startswith("good "))
    assert good_row.split() == ["good", "fakeplug", "1.0", "ok"]
    assert "    samplers: fake-greedy" in lines and "    model_loaders: fakelm" in lines
    assert "    schedulers: fcfs" in lines  # the built-ins
    broken_row = next(i for i, line in enumerate(lines) if line.startswith("broken "))
    assert lines[broken_row].split()[:4] == ["broken", "fakeplug", "1.0", "failed"]
    assert lines[broken_row + 1] == "    error: ImportError: fake_broken_plugin needs libfoo, which is not installed"
    assert any(line.startswith("blocked ") and "blocked by METRALE_DISABLE_PLUGINS" in line for line in lines)


def test_plugins_json_is_serialisable_and_complete(install):
    install("fakeplug", "1.0", FAKEPLUG)
    reg = load_registry(entry_points=fake_eps("fakeplug"))
    data = json.loads(json.dumps(plugins_json(reg)))
    by_name = {entry["name"]: entry for entry in data}
    assert by_name["good"]["components"] == {"model_loaders": ["fakelm"], "samplers": ["fake-greedy"]}
    assert by_name["good"]["version"] == "1.0" and by_name["good"]["error"] is None
    assert by_name["broken"]["status"] == "failed" and "libfoo" in by_name["broken"]["error"]
    assert by_name["builtins"]["distribution"] == "metrale-core"
