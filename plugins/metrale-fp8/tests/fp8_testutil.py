"""Helpers of the metrale-fp8 tests: tiny real checkpoints on disk and the models built from them.

Owner: ``plugins/metrale-fp8/tests``.  Checkpoints are written with safetensors into tmp dirs
(config.json + model.safetensors), opened with the real ``open_weights`` and built by the
installed llama loader, exactly as ``met`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

#: A tiny llama: 2 layers, 4 query heads over 2 KV heads of 8 dims.
TINY = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=256,
    tie_word_embeddings=True,
    hidden_act="silu",
    bos_token_id=1,
    eos_token_id=2,
)


def tiny_weights(config: dict = TINY, seed: int = 0, k_gain: float = 1.0) -> dict[str, torch.Tensor]:
    """Random weights of a llama ``config`` (``k_gain`` scales k_proj: larger cached K)."""
    gen = torch.Generator().manual_seed(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d, hq, hk = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]

    def rnd(*shape, std=0.2):
        return torch.randn(shape, generator=gen) * std

    tensors = {"model.embed_tokens.weight": rnd(v, h, std=1.0), "model.norm.weight": 1 + rnd(h, std=0.1)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "input_layernorm.weight": 1 + rnd(h, std=0.1),
            p + "post_attention_layernorm.weight": 1 + rnd(h, std=0.1),
            p + "self_attn.q_proj.weight": rnd(hq * d, h),
            p + "self_attn.k_proj.weight": rnd(hk * d, h) * k_gain,
            p + "self_attn.v_proj.weight": rnd(hk * d, h),
            p + "self_attn.o_proj.weight": rnd(h, hq * d),
            p + "mlp.gate_proj.weight": rnd(i, h),
            p + "mlp.up_proj.weight": rnd(i, h),
            p + "mlp.down_proj.weight": rnd(h, i),
        }
    return tensors


def write_checkpoint(
    directory: Path,
    extra: dict[str, torch.Tensor] | None = None,
    *,
    config: dict = TINY,
    seed: int = 0,
    model_toml: str | None = None,
    k_gain: float = 1.0,
) -> Path:
    """A HF checkpoint dir: config.json + model.safetensors (+ ``extra`` tensors, + MODEL.toml)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    tensors = tiny_weights(config, seed, k_gain) | dict(extra or {})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    if model_toml is not None:
        (directory / "MODEL.toml").write_text(model_toml)
    return directory


def load_checkpoint(directory: Path, dtype: str = "float32"):
    """The model as ``met`` loads it (``weight_store`` attached)."""
    from metrale_core.plugin.components import LoadOptions
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.weights import open_weights

    registry = load_registry()
    spec = registry.find_model_loader(json.loads((directory / "config.json").read_text()))
    store = open_weights(directory)
    model = spec.factory(store, LoadOptions(dtype=dtype))
    model.weight_store = store  # what metrale_core.loading.load.load_model attaches
    return model, registry
