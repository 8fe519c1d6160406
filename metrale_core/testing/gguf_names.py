"""llama.cpp's tensor names for a transformers decoder, written out once for the tests that write GGUFs.

Owner: the tests that write a GGUF "the way llama.cpp's converter does" from a transformers model
(the model plugins' family tests; the weight-store tests may use it too).  The names come from
gguf-py's tensor map and are written out here, so a test never reads a model definition's own
tables to build its oracle.

Invariants:
- :data:`TOP` maps the modules outside the layers (``model.embed_tokens``, ``model.norm``,
  ``lm_head``) to their GGUF names; :data:`LAYER` maps a llama-style layer's module paths
  (attention, QK-norms, the two pre-norms, the gated MLP) to theirs.  A family with other
  modules (experts, latent attention, post-norms) adds or overrides entries in its own table.
"""

from __future__ import annotations

__all__ = ["LAYER", "TOP"]

#: transformers' names outside the layers -> llama.cpp's.
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}

#: A llama-style layer's module paths -> llama.cpp's tensor names (``blk.{i}.<name>``).
LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
