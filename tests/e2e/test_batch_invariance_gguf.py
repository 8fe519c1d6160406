"""Batch invariance of the default weight format through the whole engine (``LLMEngine``).

16 greedy requests run together must each produce exactly the tokens they produce alone, in the
default format (``auto``: GGUF blocks multiplied by ``metrale_core.layers.gguf_linear``), on a
random Qwen2 (QKV bias) written as a GGUF of mixed block types, and on the embedded SmolLM2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from metrale_core.components import LoadOptions
from metrale_core.embedded import default_model_path
from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.layers.gguf_linear import GGUFLinear
from metrale_core.plugins import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.weights import open_weights

VOCAB = 256
#: GGUF name suffix -> block type (a mix, as a Q4_K_M file mixes types within a layer).
TYPES = {
    "attn_q": "Q4_0",
    "attn_k": "Q4_0",
    "attn_v": "Q8_0",
    "attn_output": "Q5_0",
    "ffn_gate": "Q4_1",
    "ffn_up": "Q4_1",
    "ffn_down": "Q5_1",
}
HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _write_qwen2_gguf(path) -> None:
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    hf = transformers.Qwen2ForCausalLM(config)
    w = GGUFWriter(str(path), "qwen2")
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_feed_forward_length(128)
    w.add_context_length(256)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight":
            continue
        a = t.float().numpy()
        if name == "model.embed_tokens.weight":
            gname, qtype = "token_embd.weight", "Q8_0"
        elif name == "model.norm.weight":
            gname, qtype = "output_norm.weight", None
        else:
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            base, kind = rest.rsplit(".", 1)
            short = HF_TO_GGUF[base]
            gname = f"blk.{i}.{short}.{kind}"
            qtype = TYPES.get(short) if kind == "weight" else None
        if qtype is None:
            w.add_tensor(gname, a)
        else:
            w.add_tensor(gname, quantize(a, GGMLQuantizationType[qtype]), raw_dtype=GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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


def test_random_qwen2_gguf_sixteen_together_equal_alone(tmp_path) -> None:
    path = tmp_path / "qwen2-mixed.gguf"
    _write_qwen2_gguf(path)
    model = _load(path)
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
    from metrale_core.layers.linear import StackedLinear

    path = tmp_path / "qwen2-mixed.gguf"
    _write_qwen2_gguf(path)
    qkv = _load(path).weights.layers[0].qkv
    assert isinstance(qkv, StackedLinear) and [p.out_features for p in qkv.parts] == [64 + 32, 32]
    x = torch.randn(3, 64)
    exact = open_weights(path)
    w = torch.cat([exact.get(f"model.layers.0.self_attn.{n}_proj.weight") for n in "qkv"])
    b = torch.cat([exact.get(f"model.layers.0.self_attn.{n}_proj.bias") for n in "qkv"])
    np.testing.assert_allclose(qkv(x).numpy(), (x @ w.T + b).numpy(), rtol=0, atol=2e-3)
