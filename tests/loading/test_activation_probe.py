"""The activation precision chosen at load (metrale_core.loading.activation_probe).

Oracles: the real embedded SmolLM2 GGUF (its probe KL is measured, above the bound: it stays
15-bit, as its chat answer needs), a random Qwen2 GGUF for the decision's other branches, the
environment override, and the repack cache holding the measured KL for the next load.
"""

from __future__ import annotations

import pytest
from loguru import logger

from metrale_core.errors import ConfigError
from metrale_core.loading import activation_probe as ap
from metrale_core.loading.load import load_model
from metrale_core.plugin.components import LoadOptions
from metrale_core.testing.random_gguf import write_random_qwen2_gguf


@pytest.fixture
def qwen2_gguf(tmp_path):
    path = tmp_path / "qwen2-mixed.gguf"
    write_random_qwen2_gguf(path)
    return path


def test_embedded_model_measures_and_stays_15_bit(monkeypatch, tmp_path):
    monkeypatch.delenv(ap.ACTIVATIONS_ENV, raising=False)
    monkeypatch.setenv("METRALE_REPACK_CACHE", str(tmp_path / "cache"))  # nothing measured yet
    loaded = load_model(None, progress=False)
    probe = loaded.activation_probe
    assert probe is not None and probe.fine and loaded.activation_precision.fine
    assert probe.kl is not None and probe.kl > ap.MAX_KL and "measured" in probe.reason
    assert loaded.activation_precision.members > 100  # every projection of the model reads it
    again = load_model(None, progress=False).activation_probe
    assert again.kl == probe.kl and "cached" in again.reason  # the next start reads it back


def test_small_kl_chooses_int8_and_every_projection_follows(monkeypatch, qwen2_gguf):
    monkeypatch.delenv(ap.ACTIVATIONS_ENV, raising=False)
    monkeypatch.setattr(ap, "MAX_KL", 1e9)
    loaded = load_model(qwen2_gguf, progress=False)
    assert not loaded.activation_probe.fine and not loaded.activation_precision.fine
    layer = loaded.model.weights.layers[0]
    assert not layer.down.fine and not layer.gate_up.fine


def test_environment_fixes_the_choice_without_a_probe(monkeypatch, qwen2_gguf):
    monkeypatch.setattr(ap, "_measure", lambda *a: pytest.fail("probed despite the environment"))
    monkeypatch.setenv(ap.ACTIVATIONS_ENV, "int8")
    loaded = load_model(qwen2_gguf, progress=False)
    assert loaded.activation_probe.kl is None and not loaded.activation_precision.fine
    monkeypatch.setenv(ap.ACTIVATIONS_ENV, "fine")
    assert load_model(qwen2_gguf, progress=False).activation_precision.fine
    monkeypatch.setenv(ap.ACTIVATIONS_ENV, "int4")
    with pytest.raises(ConfigError, match="auto, fine, int8"):
        load_model(qwen2_gguf, progress=False)


def test_a_failing_probe_keeps_15_bit_and_says_so(monkeypatch, qwen2_gguf):
    monkeypatch.delenv(ap.ACTIVATIONS_ENV, raising=False)
    monkeypatch.setenv("METRALE_REPACK_CACHE", "off")

    def boom(model, tokenizer, cell):
        cell.fine = False
        raise RuntimeError("probe broke")

    monkeypatch.setattr(ap, "_measure", boom)
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(str(m)), level="WARNING")
    try:
        loaded = load_model(qwen2_gguf, progress=False)
    finally:
        logger.remove(sink)
    assert loaded.activation_precision.fine and "RuntimeError" in loaded.activation_probe.reason
    assert any("activation probe failed" in s for s in seen)


def test_a_model_without_gguf_projections_is_not_probed(monkeypatch, qwen2_gguf):
    monkeypatch.setattr(ap, "_measure", lambda *a: pytest.fail("probed a model with no GGUF projection"))
    loaded = load_model(qwen2_gguf, LoadOptions(weight_format="exact"), progress=False)
    assert loaded.activation_precision is None and loaded.activation_probe is None


def test_probe_logits_are_the_engines_and_loading_builds_no_engine(monkeypatch, qwen2_gguf, tmp_path):
    """``all_position_logits`` runs the model over a pool of its own: every row equals the
    engine's logits after that prefix (teacher forcing), and a load never constructs an engine."""
    import torch

    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling.params import SamplingParams
    from metrale_core.testing.forward_spy import ForwardSpy

    built = []
    real_init = LLMEngine.__init__

    def counting_init(self, *args, **kwargs):
        built.append(self)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "__init__", counting_init)
    monkeypatch.delenv(ap.ACTIVATIONS_ENV, raising=False)
    monkeypatch.setenv("METRALE_REPACK_CACHE", str(tmp_path / "cache"))  # nothing measured yet
    loaded = load_model(str(qwen2_gguf), progress=False)
    assert loaded.activation_probe is not None and loaded.activation_probe.kl is not None
    assert built == []  # the probe measured without an engine

    ids = [3, 17, 5, 60, 9, 41, 22, 8, 71, 14, 2, 33, 50, 6, 19, 27, 44, 12]
    rows = ap.all_position_logits(loaded.model, ids)
    assert rows.shape[0] == len(ids)
    spy = ForwardSpy(loaded.model)
    engine = LLMEngine(spy, EngineConfig(block_size=4, num_kv_blocks=32, max_prefill_tokens=64))
    for n in (1, 7, len(ids)):
        engine.add_request(f"r{n}", ids[:n], SamplingParams(temperature=0.0, max_tokens=1))
    while engine.has_unfinished():
        engine.step()
    assert sorted(len(history) for history, _ in spy.rows) == [1, 7, len(ids)]
    for history, row in spy.rows:
        assert torch.equal(row, rows[len(history) - 1]), len(history)
