"""Helpers for the weight-store tests: tiny HF models and GGUF files written the llama.cpp way.

``hf_to_gguf`` mirrors what llama.cpp's ``convert_hf_to_gguf`` does for llama / qwen2 / qwen3:
rename tensors, permute q/k rows (weights and biases) for llama only (``LlamaModel.permute``),
drop ``lm_head`` when embeddings are tied, and write the hyper-parameters as GGUF metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch

from metrale_core.testing.gguf_names import LAYER, TOP

REAL_GGUF = Path("~/.cache/metrale/models/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()


def llama_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py), reproduced for the tests."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    base, _, kind = hf.rpartition(".")
    if base in TOP:
        return f"{TOP[base]}.{kind}"
    _, _, idx, rest = base.split(".", 3)
    return f"blk.{idx}.{LAYER[rest]}.{kind}"


def hf_to_gguf(
    path: Path,
    arch: str,
    config: dict,
    state: dict[str, np.ndarray],
    qtype_for: Callable[[str, np.ndarray], gguf.GGMLQuantizationType],
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> dict[str, np.ndarray]:
    """Write ``state`` (HF names, float32) as a GGUF file; returns GGUF name -> the bytes written."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(config["vocab_size"])])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if extra is not None:
        extra(writer)
    written = {}
    for hf, value in state.items():
        if hf == "lm_head.weight" and config["tie_word_embeddings"]:
            continue
        value = np.ascontiguousarray(value, dtype=np.float32)
        if arch == "llama" and ".q_proj." in hf:
            value = llama_permute(value, config["num_attention_heads"], config["num_attention_heads"])
        elif arch == "llama" and ".k_proj." in hf:
            value = llama_permute(value, config["num_attention_heads"], config["num_key_value_heads"])
        qtype = qtype_for(hf, value)
        data = gguf.quants.quantize(value, qtype)
        writer.add_tensor(gguf_name(hf), data, raw_dtype=qtype)
        written[gguf_name(hf)] = data
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def tiny_hf_model(arch: str, *, tie: bool, bias: bool = False, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    """A random-init transformers model of ``arch`` with dims that fit every block size (32)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
    )
    if arch == "llama":
        cfg = LlamaConfig(**common, head_dim=16, attention_bias=bias, mlp_bias=bias, rope_theta=5000.0)
        model = LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = Qwen2Config(**common, rope_theta=5000.0)
        model = Qwen2ForCausalLM(cfg)
    else:
        cfg = Qwen3Config(**common, head_dim=32, rope_theta=5000.0)  # head_dim != hidden / heads
        model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # norms are ones at init: make them distinguishable
        for _name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p))
    head_dim = getattr(cfg, "head_dim", None) or common["hidden_size"] // common["num_attention_heads"]
    hp = dict(common, head_dim=head_dim, rope_theta=5000.0)
    return model, hp
