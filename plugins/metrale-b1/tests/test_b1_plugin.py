"""The plugin as installed: its registration record, its flag, its ``/metrics`` family."""

from __future__ import annotations

import argparse

import pytest

import metrale_b1
from metrale_b1.b1_margin import B1MarginObserver, B1Stats, make_observer
from metrale_core.engine import EngineConfig
from metrale_core.engine.engine import build_pipeline
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling import PositionKind


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def test_registered_as_a_final_decode_observer_between_masks_and_penalties(registry):
    spec = registry.logit_processors["b1-margin"]
    assert spec.kinds == frozenset({PositionKind.FINAL_DECODE})
    assert spec.read_only and spec.default_enabled
    assert 100 < spec.order < 200  # masks at the default order 100; metrale-dry penalises at 200
    info = next(p for p in registry.plugins if p.name == "b1")
    assert info.error is None and info.distribution == "metrale-b1"
    assert info.components.get("logit_processors") == ["b1-margin"]


@pytest.mark.parametrize(
    "argv, enabled", [([], True), (["--b1-observer", "on"], True), (["--b1-observer", "off"], False)]
)
def test_flag_turns_the_observer_off(registry, argv, enabled):
    parser = argparse.ArgumentParser()
    registry.add_engine_flags(parser)
    args = parser.parse_args(argv)
    config = EngineConfig(plugin_options={metrale_b1.FLAG_DEST: getattr(args, metrale_b1.FLAG_DEST)})
    built = make_observer(config)
    assert isinstance(built, B1MarginObserver) if enabled else built is None
    assert ("b1-margin" in build_pipeline(config, registry).processor_names) == enabled
    if enabled:  # per-engine state: each observer (one per engine) counts on its own
        assert isinstance(built.stats, B1Stats) and built.stats is not make_observer(config).stats


def test_metrics_hook_exports_the_engines_counter(registry):
    class Engine:
        def __init__(self, config):
            self.output_processor = type("OP", (), {"pipeline": build_pipeline(config, registry)})()

    engine = Engine(EngineConfig())
    engine.output_processor.pipeline.processor("b1-margin").stats.bump(3)
    expected = engine.output_processor.pipeline.processor("b1-margin").stats.b1_low_margin
    (family,) = metrale_b1.metrale_metrics(engine)
    assert family.name == metrale_b1.METRIC_NAME and family.type == "counter"
    assert [s.value for s in family.samples if s.name.endswith("_total")] == [expected]
    assert metrale_b1.metrale_metrics(Engine(EngineConfig(plugin_options={"b1_observer": "off"}))) is None
