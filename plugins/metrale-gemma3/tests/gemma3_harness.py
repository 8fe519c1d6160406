"""Test harness for the gemma3 plugin: random HF Gemma 3 checkpoints and the HF oracle.

Owner: ``plugins/metrale-gemma3/tests``.
"""

from __future__ import annotations

import torch

from metrale_core.testing.hf_random import eager_model, randomize_

VOCAB = 128

CONFIGS = {
    # A window (6) shorter than every prompt, so the mask matters; two sliding layers around a
    # global one; final-logit soft-capping (and an attention soft-cap, which Gemma 3 ignores as
    # transformers does); a softmax scale
    # (query_pre_attn_scalar 24) that is not head_dim's; GQA 2.
    "window6-softcap": {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "sliding_window": 6,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        "attn_logit_softcapping": 20.0,
        "final_logit_softcapping": 15.0,
        "max_position_embeddings": 512,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    },
    # Linear RoPE scaling (factor 4) on the global layers only; a window of 16 (longer than one
    # prompt, shorter than the others); the default every-6th-layer pattern cut to 6 layers; MQA.
    "rope-linear": {
        "vocab_size": VOCAB,
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 16,
        "max_position_embeddings": 512,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    },
}


def make_hf_model(name: str, seed: int = 0, config: dict | None = None):
    """A random ``Gemma3ForCausalLM`` (fp32, eager attention, eval) of config ``name`` (or of
    ``config``, a variant of it)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = dict(config or CONFIGS[name], pad_token_id=0, bos_token_id=2, eos_token_id=1)
    model = eager_model(Gemma3TextConfig, Gemma3ForCausalLM, seed, **config)
    randomize_(model, seed, norms=(0.0, 0.3))  # norms: 1 + w, w around 0
    model.tie_weights()
    return model


def save_checkpoint(name: str, path, seed: int = 0):
    """Random model ``name`` saved with ``save_pretrained`` into ``path``; returns the HF model."""
    model = make_hf_model(name, seed)
    model.save_pretrained(path, safe_serialization=True)
    return model


def hf_logits(model, ids) -> torch.Tensor:
    """``[len(ids), vocab]`` float32 logits of one sequence."""
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].float()


def hf_greedy(model, prompt, n: int) -> list[int]:
    """``n`` greedy tokens from ``generate`` with no EOS (the engine side runs ``ignore_eos``)."""
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt) :].tolist()
