"""The plugin as installed: registration, flags through the CLI mapping, /metrics families."""

from __future__ import annotations

import argparse

import pytest
from fp8_testutil import load_checkpoint, write_checkpoint

from metrale_core.cli.flags import add_engine_flags, engine_config_from_args
from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams


def test_registered_from_its_distribution():
    registry = load_registry()
    assert "fp8" in registry.kv_scale_sources
    assert registry.provider("kv_scale_sources", "fp8").distribution == "metrale-fp8"


def parse(argv):
    parser = argparse.ArgumentParser()
    add_engine_flags(parser, load_registry())
    return parser.parse_args(argv)


def test_flags_land_in_engine_config():
    config = engine_config_from_args(
        parse(["--kv-cache-dtype", "fp8", "--fp8-kv-calibration-tokens", "256", "--fp8-kv-headroom", "1.5"])
    )
    assert config.kv_cache_dtype == "fp8"
    assert config.plugin_options["fp8_kv_calibration_tokens"] == 256
    assert config.plugin_options["fp8_kv_headroom"] == 1.5
    defaults = engine_config_from_args(parse([]))
    assert defaults.kv_cache_dtype is None
    assert defaults.plugin_options["fp8_kv_calibration_tokens"] is None  # -> MODEL.toml -> 0
    assert defaults.plugin_options["fp8_kv_headroom"] == 2.0


@pytest.mark.parametrize(
    "argv", [["--fp8-kv-headroom", "0.9"], ["--fp8-kv-calibration-tokens", "-1"], ["--fp8-kv-headroom", "nan"]]
)
def test_bad_flag_values_are_argparse_errors(argv):
    with pytest.raises(SystemExit):
        parse(argv)


def test_metrics_report_per_layer_sources(tmp_path):
    from metrale_fp8 import metrale_metrics

    model, registry = load_checkpoint(write_checkpoint(tmp_path / "c"))
    engine = LLMEngine(
        model,
        EngineConfig(
            num_kv_blocks=8, block_size=4, kv_cache_dtype="fp8", plugin_options={"fp8_kv_calibration_tokens": 3}
        ),
        registry=registry,
    )
    families = {f.name: f for f in metrale_metrics(engine)}
    assert families["metrale:fp8_kv_calibration_open_layers"].samples[0].value == 2
    by_source = {s.labels["source"]: s.value for s in families["metrale:fp8_kv_scale_source_layers"].samples}
    assert by_source == {"checkpoint": 0, "calibration": 2, "unit": 0}
    engine.add_request("a", [3, 4, 5, 6], SamplingParams(max_tokens=1))
    engine.step()
    families = {f.name: f for f in metrale_metrics(engine)}
    assert families["metrale:fp8_kv_calibration_open_layers"].samples[0].value == 0
    scales = families["metrale:fp8_kv_scale"].samples
    assert {(s.labels["layer"], s.labels["tensor"]) for s in scales} == {("0", "k"), ("0", "v"), ("1", "k"), ("1", "v")}
    assert all(0 < s.value < 1 for s in scales)  # calibrated, no longer 1.0
    plain = LLMEngine(model, EngineConfig(num_kv_blocks=8), registry=registry)
    assert metrale_metrics(plain) == []
