"""OLMo 2, the decoder definition's worked example, vs transformers' ``Olmo2ForCausalLM``.

Two small random configs (fp32, ``exact`` weights): logits through the paged path with chunked
prefill and mixed decode rows (max |diff| <= 1e-4), logits and greedy tokens through the real
engine vs ``generate``, and the same model written as a GGUF under llama.cpp's names.
"""

from __future__ import annotations

import pytest
import torch
from family_testlib import (
    VOCAB,
    add_float_tensors,
    engine_rows,
    forward_reference,
    gguf_file,
    load_family,
    load_gguf,
    worst_row,
)
from qwen3_harness import build_hf, max_logit_diff, open_store, run_mixed_schedule, save_checkpoint
from transformers import Olmo2Config, Olmo2ForCausalLM

from metrale_core.errors import ConfigError
from metrale_core.layers.parallel import TensorParallel
from metrale_core.testing.gguf_names import LAYER
from metrale_core.testing.plugin_listing import installed_plugin

NEW_TOKENS = 16
CONFIGS = {
    # GQA ratio 2, untied head, a large RoPE base.
    "gqa2-untied": dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    # MHA, tied head, attention biases, linear RoPE scaling, three layers.
    "mha-tied-bias-linear-rope": dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_bias=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    ),
}
PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60],
    [2, 70, 33, 14, 95, 7, 50, 21, 11, 64, 3, 8, 19],
    [44, 1, 90],
    [12, 12, 80, 6, 37, 58, 29, 71, 4, 66],
]


def test_olmo2_is_installed_and_registered():
    reg, _ = installed_plugin("olmo2", "metrale_qwen3.olmo2", "metrale-qwen3")
    spec = reg.model_loaders["olmo2"]
    assert spec.model_types == ("olmo2",) and spec.architectures == ("Olmo2ForCausalLM",)
    assert reg.find_model_loader({"model_type": "x", "architectures": ["Olmo2ForCausalLM"]}).name == "olmo2"
    # the whole-projection QK-norm cannot be sharded: refused with the definition's reason
    assert not spec.tensor_parallel and "QK-norm" in spec.tensor_parallel_note


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_olmo2_paged_logits_match_hf(name, tmp_path):
    torch.set_num_threads(2)
    hf = build_hf(Olmo2Config, Olmo2ForCausalLM, seed=len(name), **CONFIGS[name])
    model = load_family("olmo2", open_store(save_checkpoint(hf, tmp_path)))
    layer = model.weights.layers[0]
    assert layer.attn_norm is None and layer.mlp_norm is None  # post-norms only
    assert layer.q_norm.shape == (CONFIGS[name]["hidden_size"],)  # over the whole projection
    runner = run_mixed_schedule(model, PROMPTS, decode_steps=8, block_size=4)
    assert max_logit_diff(hf, runner) <= 1e-4


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_olmo2_engine_logits_and_greedy_match_hf(name, tmp_path):
    torch.set_num_threads(2)
    hf = build_hf(Olmo2Config, Olmo2ForCausalLM, seed=len(name) + 1, **CONFIGS[name])
    model = load_family("olmo2", open_store(save_checkpoint(hf, tmp_path)))
    outputs, rows, _ = engine_rows(model, NEW_TOKENS, prompts=PROMPTS)
    assert worst_row(rows, *forward_reference(hf, outputs, PROMPTS)) <= 1e-4
    for prompt, out in zip(PROMPTS, outputs):
        ids = torch.tensor([prompt])
        with torch.no_grad():  # the mask given: token 1 is OLMo 2's pad id, which generate would mask out
            gen = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
        assert out == gen[0, len(prompt) :].tolist()


#: HF module path -> llama.cpp's OLMo 2 tensor name: a llama layer's, its norms after the
#: attention and the MLP instead of before.
_GGUF = {**LAYER, "post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def _write_gguf(hf, path) -> None:
    with gguf_file(path, "olmo2", hf.config, VOCAB) as w:
        add_float_tensors(w, hf, _GGUF)


def test_olmo2_gguf_logits_match_hf(tmp_path):
    torch.set_num_threads(2)
    config = CONFIGS["gqa2-untied"]
    hf = build_hf(Olmo2Config, Olmo2ForCausalLM, seed=11, **config)
    model = load_gguf(tmp_path / "olmo2.gguf", lambda path: _write_gguf(hf, path), "olmo2")
    runner = run_mixed_schedule(model, PROMPTS, decode_steps=4, block_size=4)
    assert max_logit_diff(hf, runner) <= 1e-4


def test_olmo2_refuses_tensor_parallelism_with_the_reason(tmp_path):
    hf = build_hf(Olmo2Config, Olmo2ForCausalLM, seed=2, **CONFIGS["gqa2-untied"])
    store = open_store(save_checkpoint(hf, tmp_path))
    with pytest.raises(ConfigError, match="whole projection"):
        load_family("olmo2", store, tensor_parallel=TensorParallel(rank=0, world=2))
