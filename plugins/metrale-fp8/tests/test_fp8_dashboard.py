"""The ``fp8_scale_source`` snapshot extra: attached by ``metrale_engine_started`` to FP8 engines
built with the registry, tracking calibration freezing, and rendered on the dashboard's stats tab."""

from __future__ import annotations

import pytest
import torch
from fp8_testutil import load_checkpoint, write_checkpoint

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.sampling.params import SamplingParams
from metrale_fp8.dashboard import scale_source_summary


def scales(layers) -> dict:
    return {f"model.layers.{i}.self_attn.{t}_scale": torch.tensor(0.02) for i in layers for t in "kv"}


def engine_on(directory, registry_model=None, **plugin_options):
    model, registry = registry_model or load_checkpoint(directory)
    config = EngineConfig(num_kv_blocks=8, block_size=4, kv_cache_dtype="fp8", plugin_options=plugin_options)
    return LLMEngine(model, config, registry=registry)


def step_once(engine, prompt=(3, 4, 5, 6)) -> dict:
    engine.add_request("a", list(prompt), SamplingParams(max_tokens=1))
    engine.step()
    return dict(engine.snapshots.latest.extras)


def test_calibration_line_turns_frozen_after_the_window(tmp_path):
    engine = engine_on(write_checkpoint(tmp_path / "c"), fp8_kv_calibration_tokens=3)
    assert scale_source_summary(engine.runner.kv.codec) == "calibration (3 tok, 2 open) on 2/2 layers"
    extras = step_once(engine)
    assert extras["fp8_scale_source"] == "calibration (3 tok, frozen) on 2/2 layers"


@pytest.mark.parametrize(
    "layers, expected",
    [
        ((0, 1), "checkpoint on 2/2 layers"),
        ((1,), "partial: checkpoint on 1/2 layers, 1.0 on 1 (unit: 0; checkpoint: 1)"),
        ((), "unscaled: 1.0 on 2/2 layers"),
    ],
)
def test_checkpoint_partial_and_unscaled_lines(tmp_path, layers, expected):
    engine = engine_on(write_checkpoint(tmp_path / "c", scales(layers)))
    assert step_once(engine)["fp8_scale_source"] == expected


def test_no_line_on_an_engine_without_fp8(tmp_path):
    model, registry = load_checkpoint(write_checkpoint(tmp_path / "c"))
    plain = LLMEngine(model, EngineConfig(num_kv_blocks=8, block_size=4), registry=registry)
    assert "fp8_scale_source" not in step_once(plain)


def test_stats_tab_shows_the_scale_source(tmp_path):
    from metrale_core.tui.stats_pane import RateTracker, stats_texts

    engine = engine_on(write_checkpoint(tmp_path / "c", scales((0, 1))))
    step_once(engine)
    text = stats_texts(engine.snapshots.latest, RateTracker())["plugins"].plain
    assert "FP8 scale source: checkpoint on 2/2 layers" in text
