"""A small random Qwen2 written as a GGUF of mixed block types, for tests of the GGUF path.

Owner: the tests of batch invariance (``tests/e2e``) and of the load-time activation probe
(``tests/loading/test_activation_probe.py``).  Invariants: deterministic (seeded) weights;
transformers' Qwen2 is the source, so the file's maths is a real model's.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from metrale_core.text.tokenizer import _BYTE_CHARS

__all__ = ["HF_TO_GGUF", "TYPES", "VOCAB", "write_random_qwen2_gguf"]

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


def write_random_qwen2_gguf(path: Path) -> None:
    """A random 2-layer Qwen2 (QKV bias, tied embeddings) as a GGUF of the mixed block :data:`TYPES`."""
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
    # a byte-level vocabulary of the 256 bytes and no merges: any text encodes, one token a byte
    w.add_tokenizer_model("gpt2")
    w.add_token_list([_BYTE_CHARS[b] for b in range(VOCAB)])
    w.add_token_merges([])
    w.add_eos_token_id(0)
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
