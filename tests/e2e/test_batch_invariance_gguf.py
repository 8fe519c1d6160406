"""Batch invariance of the default weight format through the whole engine (``LLMEngine``).

16 greedy requests run together must each produce exactly the tokens they produce alone, in the
default format (``auto``: GGUF blocks multiplied by ``metrale_core.layers.formats.gguf_linear``), on a
random Qwen2 (QKV bias) written as a GGUF of mixed block types (15-bit and int8 activations), and
on the embedded SmolLM2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.layers.formats.gguf_linear import GGUFLinear, activation_precision_scope
from metrale_core.loading.embedded import default_model_path
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.random_gguf import VOCAB, write_random_qwen2_gguf
from metrale_core.weights import open_weights


def _load(path):
    store = open_weights(path)
    return load_registry().find_model_loader(store.config).factory(store, LoadOptions())


def _run(model, requests) -> dict[str, list[int]]:
    engine = LLMEngine(model, EngineConfig(block_size=16, num_kv_blocks=256, max_prefill_tokens=256))
    outs = {rid: [] for rid, _ in requests}
    for rid, prompt in requests:
        engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    while engine.has_unfinished():
        for out in engine.step():
            assert out.finish_reason != "error", out.error
            outs[out.request_id].extend(out.new_token_ids)
    return outs


def _prompts(vocab: int) -> list[tuple[str, list[int]]]:
    g = torch.Generator().manual_seed(3)
    return [
        (f"r{i}", torch.randint(3, vocab, (int(torch.randint(2, 24, (1,), generator=g)),), generator=g).tolist())
        for i in range(16)
    ]


def _check(model, vocab: int) -> None:
    requests = _prompts(vocab)
    together = _run(model, requests)
    for rid, prompt in requests:
        assert _run(model, [(rid, prompt)])[rid] == together[rid], rid


@pytest.mark.parametrize("fine", [True, False], ids=["15-bit", "int8"])
def test_random_qwen2_gguf_sixteen_together_equal_alone(tmp_path, fine: bool) -> None:
    """In either activation precision the load may choose (engine.activation_probe)."""
    path = tmp_path / "qwen2-mixed.gguf"
    write_random_qwen2_gguf(path)
    with activation_precision_scope() as precision:
        model = _load(path)
    precision.fine = fine
    layer = model.weights.layers[0]
    assert model.weights.weight_format == "auto"
    assert isinstance(layer.down, GGUFLinear) and layer.qkv.bias is not None  # blocks, QKV bias kept
    _check(model, VOCAB)


@pytest.mark.slow
def test_smollm2_sixteen_together_equal_alone() -> None:
    torch.set_num_threads(2)
    model = _load(default_model_path())
    assert isinstance(model.weights.layers[0].gate_up, GGUFLinear)
    _check(model, 49152)


def test_mixed_types_of_one_projection_are_stacked(tmp_path) -> None:
    """attn_q/attn_k Q4_0 and attn_v Q8_0: one fused projection of two block matrices."""
    from metrale_core.layers.formats.linear import StackedLinear

    path = tmp_path / "qwen2-mixed.gguf"
    write_random_qwen2_gguf(path)
    qkv = _load(path).weights.layers[0].qkv
    assert isinstance(qkv, StackedLinear) and [p.out_features for p in qkv.parts] == [64 + 32, 32]
    x = torch.randn(3, 64)
    exact = open_weights(path)
    w = torch.cat([exact.get(f"model.layers.0.self_attn.{n}_proj.weight") for n in "qkv"])
    b = torch.cat([exact.get(f"model.layers.0.self_attn.{n}_proj.bias") for n in "qkv"])
    np.testing.assert_allclose(qkv(x).numpy(), (x @ w.T + b).numpy(), rtol=0, atol=2e-3)
