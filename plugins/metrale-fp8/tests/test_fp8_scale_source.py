"""Seed 001: the four scale-source outcomes, their exact log lines, and the option precedence."""

from __future__ import annotations

import pytest
import torch
from fp8_testutil import TINY, load_checkpoint, write_checkpoint

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.errors import ConfigError
from metrale_fp8.build import describe_sources
from metrale_fp8.census import KvScaleCensus, LayerKvScales
from metrale_fp8.options import resolve_fp8_options
from metrale_fp8.scale_source import (
    Calibration,
    Checkpoint,
    Partial,
    Unscaled,
    fp8_kv_scale_source,
    log_fp8_kv_scale_source,
)

CALIBRATION_NO_CKPT = (
    "FP8 KV scales: online calibration on every layer (checkpoint ships no k/v scales): "
    "accumulating per-tensor K/V amax over the first {n} observed tokens (across requests, "
    "readiness probe included) before freezing."
)
CALIBRATION_SHADOWED = (
    "FP8 KV scales: online calibration over {n} tokens on every layer; the {s} per-layer "
    "checkpoint scales ({sp}) are loaded but NOT used. Pass --fp8-kv-calibration-tokens 0 to use them."
)
CHECKPOINT = "FP8 KV scales: from the checkpoint on all {n} attention layers ({sp}); no calibration needed."
PARTIAL = (
    "FP8 KV scales: PARTIAL — the checkpoint ships scales ({sp}) for only {c} of {a} attention "
    "layers; the other {o} run at 1.0, which wastes E4M3 range on small K/V and clips any "
    "|x| > 448. Enable --fp8-kv-calibration-tokens 256, or use --kv-cache-dtype bf16/nvfp4."
)
UNSCALED = (
    "FP8 KV scales: 1.0 on all {a} attention layers — the checkpoint ships NO k/v scales and "
    "calibration is off. 1.0 wastes E4M3 range on small K/V and clips any |x| > 448. Enable "
    "--fp8-kv-calibration-tokens 256 for online calibration, or use --kv-cache-dtype nvfp4/bf16."
)


def census(spellings_by_layer: dict[int, str]) -> KvScaleCensus:
    one = torch.ones(1)
    return KvScaleCensus({i: LayerKvScales(i, one, one, s, ()) for i, s in spellings_by_layer.items()})


@pytest.mark.parametrize(
    "tokens, ckpt, attn, expected",
    [
        (256, 0, 30, Calibration(tokens=256, shadowed=0)),
        (1, 30, 30, Calibration(tokens=1, shadowed=30)),
        (0, 30, 30, Checkpoint(layers=30)),
        (0, 31, 30, Checkpoint(layers=31)),  # an MTP head ships scales too: still every layer
        (0, 12, 30, Partial(from_checkpoint=12, attention_layers=30)),
        (0, 0, 30, Unscaled(attention_layers=30)),
    ],
)
def test_classification(tokens, ckpt, attn, expected):
    assert fp8_kv_scale_source(tokens, ckpt, attn) == expected


def test_describe_sources():
    assert describe_sources(["checkpoint", "checkpoint", "unit", "checkpoint"]) == "checkpoint: 0-1, 3; unit: 2"
    assert describe_sources(["calibration"] * 30) == "calibration: 0-29"


def test_log_lines_word_for_word(log_lines):
    both = census({0: "k_scale/v_scale", 1: "kv_scale"})
    log_fp8_kv_scale_source(Calibration(256, 0), census({}), auto_enabled=False)
    log_fp8_kv_scale_source(Calibration(256, 0), census({}), auto_enabled=True)
    log_fp8_kv_scale_source(Calibration(64, 2), both, auto_enabled=False)
    log_fp8_kv_scale_source(Checkpoint(2), both, auto_enabled=False)
    log_fp8_kv_scale_source(Partial(1, 4), census({0: "k_scale/v_scale"}), auto_enabled=False)
    log_fp8_kv_scale_source(Unscaled(4), census({}), auto_enabled=False)
    assert log_lines == [
        ("INFO", CALIBRATION_NO_CKPT.format(n=256)),
        ("INFO", CALIBRATION_NO_CKPT.format(n=256) + " (auto-enabled from MODEL.toml)"),
        ("INFO", CALIBRATION_SHADOWED.format(n=64, s=2, sp="k_scale/v_scale, kv_scale")),
        ("INFO", CHECKPOINT.format(n=2, sp="k_scale/v_scale, kv_scale")),
        ("WARNING", PARTIAL.format(sp="k_scale/v_scale", c=1, a=4, o=3)),
        ("WARNING", UNSCALED.format(a=4)),
    ]


# --- end to end: engine start-up over real checkpoints -------------------------------------------


def scales(layers) -> dict:
    return {f"model.layers.{i}.self_attn.{t}_scale": torch.tensor(0.02) for i in layers for t in "kv"}


def start(directory, log_lines, **plugin_options):
    model, registry = load_checkpoint(directory)
    engine = LLMEngine(
        model,
        EngineConfig(num_kv_blocks=8, block_size=4, kv_cache_dtype="fp8", plugin_options=plugin_options),
        registry=registry,
    )
    lines = [line for line in log_lines if line[1].startswith("FP8 KV scales:")]
    assert len(lines) == 1, lines
    return engine.runner.kv.codec, lines[0]


@pytest.mark.parametrize(
    "layers, level, text, sources",
    [
        ([0, 1], "INFO", CHECKPOINT.format(n=2, sp="k_scale/v_scale"), ["checkpoint"] * 2),
        ([1], "WARNING", PARTIAL.format(sp="k_scale/v_scale", c=1, a=2, o=1), ["unit", "checkpoint"]),
        ([], "WARNING", UNSCALED.format(a=2), ["unit", "unit"]),
    ],
)
def test_engine_startup_outcomes(tmp_path, log_lines, layers, level, text, sources):
    codec, line = start(write_checkpoint(tmp_path / "c", scales(layers)), log_lines)
    assert line == (level, text)
    assert codec.sources == sources
    per_layer = [m for _, m in log_lines if m.startswith("FP8 KV scale source per layer: ")]
    assert per_layer == ["FP8 KV scale source per layer: " + describe_sources(sources)]
    for i, src in enumerate(sources):
        expected = 0.02 if src == "checkpoint" else 1.0
        assert codec.k_scales[i].tolist() == pytest.approx([expected] * TINY["num_key_value_heads"])


def test_calibration_shadows_checkpoint_scales(tmp_path, log_lines):
    codec, line = start(write_checkpoint(tmp_path / "c", scales([0, 1])), log_lines, fp8_kv_calibration_tokens=32)
    assert line == ("INFO", CALIBRATION_SHADOWED.format(n=32, s=2, sp="k_scale/v_scale"))
    assert codec.sources == ["calibration", "calibration"] and codec.num_open_windows == 2


def test_model_toml_enables_calibration(tmp_path, log_lines):
    toml = "[behavior]\nfp8_kv_calibration_tokens = 256\nthinking_default = true\n"
    codec, line = start(write_checkpoint(tmp_path / "c", model_toml=toml), log_lines)
    assert line == ("INFO", CALIBRATION_NO_CKPT.format(n=256) + " (auto-enabled from MODEL.toml)")
    assert codec.calibration_tokens == 256


def test_flag_beats_model_toml(tmp_path, log_lines):
    toml = "[behavior]\nfp8_kv_calibration_tokens = 256\n"
    codec, line = start(write_checkpoint(tmp_path / "c", model_toml=toml), log_lines, fp8_kv_calibration_tokens=0)
    assert line == ("WARNING", UNSCALED.format(a=2)) and codec.num_open_windows == 0
    log_lines.clear()
    codec, line = start(write_checkpoint(tmp_path / "d", model_toml=toml), log_lines, fp8_kv_calibration_tokens=8)
    assert line == ("INFO", CALIBRATION_NO_CKPT.format(n=8))


def test_precedence_and_clamp(tmp_path):
    toml_dir = write_checkpoint(tmp_path / "t", model_toml="[behavior]\nfp8_kv_calibration_tokens = 9000\n")
    assert resolve_fp8_options({}, None).calibration_tokens == 0
    assert resolve_fp8_options({}, tmp_path / "nothing-here").calibration_tokens == 0
    from_toml = resolve_fp8_options({}, toml_dir)
    assert (from_toml.calibration_tokens, from_toml.auto_enabled) == (4096, True)
    flag = resolve_fp8_options({"fp8_kv_calibration_tokens": 5000}, toml_dir)
    assert (flag.calibration_tokens, flag.auto_enabled) == (4096, False)
    assert resolve_fp8_options({"fp8_kv_calibration_tokens": 1}, toml_dir).calibration_tokens == 1
    # a GGUF-style single file: MODEL.toml beside it
    gguf = toml_dir / "model.gguf"
    gguf.write_bytes(b"")
    assert resolve_fp8_options({}, gguf).calibration_tokens == 4096


def test_headroom(tmp_path):
    assert resolve_fp8_options({}, None).headroom == 2.0
    assert resolve_fp8_options({"fp8_kv_headroom": 1.0}, None).headroom == 1.0
    for bad in (0.5, float("nan"), "2"):
        with pytest.raises(ConfigError, match="--fp8-kv-headroom"):
            resolve_fp8_options({"fp8_kv_headroom": bad}, None)


def test_bad_model_toml_is_a_config_error(tmp_path):
    broken = write_checkpoint(tmp_path / "b", model_toml="[behavior\n")
    with pytest.raises(ConfigError, match=r"MODEL.toml: not valid TOML"):
        resolve_fp8_options({}, broken)
    wrong = write_checkpoint(tmp_path / "w", model_toml='[behavior]\nfp8_kv_calibration_tokens = "x"\n')
    with pytest.raises(ConfigError, match=r"\[behavior\].fp8_kv_calibration_tokens"):
        resolve_fp8_options({}, wrong)


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_calibration_flag_without_fp8_is_refused(tmp_path, dtype):
    model, registry = load_checkpoint(write_checkpoint(tmp_path / "c"))
    config = EngineConfig(num_kv_blocks=8, kv_cache_dtype=dtype, plugin_options={"fp8_kv_calibration_tokens": 256})
    with pytest.raises(ConfigError, match="--fp8-kv-calibration-tokens 256 needs --kv-cache-dtype fp8"):
        LLMEngine(model, config, registry=registry)


def test_model_toml_window_without_fp8_is_not_an_error(tmp_path):
    toml = "[behavior]\nfp8_kv_calibration_tokens = 256\n"
    model, registry = load_checkpoint(write_checkpoint(tmp_path / "c", model_toml=toml))
    engine = LLMEngine(model, EngineConfig(num_kv_blocks=8, kv_cache_dtype="bf16"), registry=registry)
    assert engine.runner.kv.plain and engine.runner.kv.k[0].dtype == torch.bfloat16
