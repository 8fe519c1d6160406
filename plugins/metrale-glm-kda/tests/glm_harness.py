"""Tiny random GLM-5.3 (``glm5_next``) checkpoints for the plugin's tests and benchmark.

Two configs cover the layer kinds: ``hc2`` (hc_mult 2, lower-bound gate, one expert group) and
``hc4`` (hc_mult 4, softplus gate, grouped routing, an attention layer first); both mix dense and
sparse MLPs and full and shared indexer layers, with ``index_topk`` far below the prompt lengths
so the sparse selection matters.  Parameters transformers initialises to constants (norm weights,
mHC base/scale, indexer pool gate/APE, router bias, A_log) are randomised so parity can fail.
"""

from __future__ import annotations

import json

import torch

VOCAB = 160

CONFIGS = {
    "hc2": dict(
        hc_mult=2,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=4,
        layer_types=["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"],
        indexer_types=["full", "full", "shared", "full"],
        mlp_layer_types=["dense", "sparse", "sparse", "dense"],
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        linear_lower_bound=-5.0,
        index_topk=8,
        index_kpool=4,
        linear_num_heads=2,
        linear_head_dim=8,
    ),
    "hc4": dict(
        hc_mult=4,
        hidden_size=32,
        intermediate_size=40,
        moe_intermediate_size=12,
        num_hidden_layers=5,
        layer_types=[
            "indexed_attention",
            "linear_attention",
            "linear_attention",
            "indexed_attention",
            "indexed_attention",
        ],
        indexer_types=["full", "full", "full", "full", "shared"],
        mlp_layer_types=["sparse", "dense", "sparse", "sparse", "dense"],
        n_routed_experts=8,
        num_experts_per_tok=3,
        n_group=2,
        topk_group=1,
        linear_lower_bound=None,
        index_topk=6,
        index_kpool=2,
        linear_num_heads=2,
        linear_head_dim=16,
    ),
}

_COMMON = dict(
    vocab_size=VOCAB,
    num_attention_heads=2,
    num_key_value_heads=2,
    n_shared_experts=1,
    kv_lora_rank=16,
    q_lora_rank=24,
    qk_nope_head_dim=8,
    v_head_dim=8,
    qk_rope_head_dim=0,
    index_head_dim=8,
    index_n_heads=16,
    max_position_embeddings=1024,
    pad_token_id=0,
    routed_scaling_factor=2.5,
    swiglu_limit=10.0,
    eos_token_id=None,
)
_VISION = dict(
    depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32, projection_intermediate_size=16
)


def hf_config(name: str, **overrides):
    from transformers import Glm5NextConfig

    text = {**_COMMON, **CONFIGS[name], **overrides}
    return Glm5NextConfig(text_config=text, vision_config=_VISION)


def _randomise(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 1)

    def rand(shape, scale, mean=0.0):
        return torch.randn(shape, generator=g) * scale + mean

    with torch.no_grad():
        for name, p in model.model.language_model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(rand(p.shape, 0.1, 1.0))
            elif name.endswith(("hc.base", "_ape", "k_norm.bias")):
                p.copy_(rand(p.shape, 0.5))
            elif name.endswith("hc.scale"):
                p.copy_(rand(p.shape, 0.3, 1.0))
            elif name.endswith("compress_gate"):
                p.copy_(rand(p.shape, 0.3))
            elif name.endswith("A_log"):
                p.copy_(rand(p.shape, 0.5))
            elif name.endswith(("f_a_proj.weight", "f_b_proj.weight", "b_proj.weight")):
                p.copy_(rand(p.shape, 0.3))
            elif name.endswith("hc.fn"):
                p.copy_(rand(p.shape, 0.1))
        for name, b in model.model.language_model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(rand(b.shape, 0.05))


def make_hf_model(name: str, seed: int = 0, **overrides):
    """A random-init ``Glm5NextForConditionalGeneration`` (fp32, eval) of config ``name``."""
    from transformers import Glm5NextForConditionalGeneration

    torch.manual_seed(seed)
    model = Glm5NextForConditionalGeneration(hf_config(name, **overrides)).eval()
    _randomise(model, seed)
    return model


def write_tokenizer(path) -> None:
    """A tiny word-level ``tokenizer.json`` over the ids ``0 .. VOCAB-1`` (``t<i>`` words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB)}
    vocab["<unk>"] = VOCAB - 1
    del vocab[f"t{VOCAB - 1}"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"unk_token": "<unk>"}))


def save_checkpoint(name: str, path, seed: int = 0, tokenizer: bool = False, **overrides):
    """Random model ``name`` saved with ``save_pretrained`` into ``path``; returns the HF model."""
    model = make_hf_model(name, seed, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        write_tokenizer(path)
    return model


def hf_logits(model, ids) -> torch.Tensor:
    """``[len(ids), vocab]`` float32 logits of one sequence."""
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].float()


def hf_greedy(model, prompt, n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()
