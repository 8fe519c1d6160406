"""Weight loading through the ``WeightStore``: every tensor of one Gemma 3 decoder, projections fused.

Owner: ``metrale_gemma3``; ``loader.load_gemma3`` calls :func:`load_weights`.

Invariants:
- Tensors are read only through ``store.get(name, dtype=, shape=)`` with the shape the config
  implies, so a wrong checkpoint fails with ``ShapeMismatch`` naming the tensor.
- :func:`tensor_names` is the one place that knows where a tensor lives: HF ``gemma3_text``
  (``model.``), HF ``gemma3`` multimodal checkpoints (``model.language_model.`` or
  ``language_model.model.``), and GGUF files (the store maps the llama names it knows; Gemma's
  four norms ``attn_norm`` / ``post_attention_norm`` / ``ffn_norm`` / ``post_ffw_norm`` are looked
  up here, since ``ffn_norm`` is the pre-FFN norm in Gemma, not Llama's post-attention one).
- Norm weights are kept as HF stores them (the offset ``w`` of ``1 + w``): a GGUF's ``1 + w``
  has 1 subtracted.  The per-head q/k norms are kept folded (``1 + w``), since the shared
  QK-norm + RoPE op multiplies by its weight directly.
- The output head is the embedding (Gemma 3 ties them), unscaled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from attrs import frozen

from metrale_core.api import ConfigError, Linear, build_linear
from metrale_gemma3.config import Gemma3Dims

__all__ = ["Gemma3Weights", "LayerWeights", "load_weights", "tensor_names"]

_HF_PREFIXES = ("model.", "model.language_model.", "language_model.model.")


@frozen
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear
    o_proj: Linear
    #: ``1 + w`` of the per-head norms (folded; see the module invariants).
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    pre_ffn_norm: torch.Tensor
    post_ffn_norm: torch.Tensor
    gate_up: Linear
    down: Linear


@frozen
class Gemma3Weights:
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    head: Linear
    weight_format: str = "exact"


def tensor_names(store: Any, dims: Gemma3Dims) -> Callable[[str], str]:
    """``name(hf_suffix)`` -> the store's name for HF tensor ``model.<hf_suffix>``."""
    if dims.norm_offset_stored:  # GGUF
        gguf_norms = {
            "post_attention_layernorm": "post_attention_norm",
            "pre_feedforward_layernorm": "post_attention_layernorm",
            "post_feedforward_layernorm": "post_ffw_norm",
        }

        def gguf(suffix: str) -> str:
            parts = suffix.split(".")
            if parts[0] == "layers" and parts[2] in gguf_norms:
                norm = gguf_norms[parts[2]]
                if norm == "post_attention_layernorm":  # the store's llama name for ffn_norm
                    return f"model.layers.{parts[1]}.post_attention_layernorm.weight"
                return f"blk.{parts[1]}.{norm}.weight"
            return "model." + suffix

        return gguf
    for prefix in _HF_PREFIXES:
        if f"{prefix}embed_tokens.weight" in store:

            def hf(suffix: str, prefix: str = prefix) -> str:
                return prefix + suffix

            return hf
    raise ConfigError(
        "gemma3: the checkpoint holds no embed_tokens.weight under "
        f"{', '.join(p + 'embed_tokens' for p in _HF_PREFIXES)}"
    )


def load_weights(
    store: Any, dims: Gemma3Dims, dtype: torch.dtype, device: torch.device | str, weight_format: str = "exact"
) -> Gemma3Weights:
    """Read, check and fuse every tensor of the decoder, projections in ``weight_format``."""
    name = tensor_names(store, dims)
    shift = 1.0 if dims.norm_offset_stored else 0.0

    def norm(suffix: str, size: int, *, folded: bool = False) -> torch.Tensor:
        w = store.get(name(suffix), dtype=torch.float32, shape=(size,)) - shift
        return (1.0 + w if folded else w).to(dtype).to(device)

    def linear(suffixes: list[str], shapes: list[tuple[int, int]]) -> Linear:
        return build_linear(store, [name(s) for s in suffixes], shapes, weight_format, dtype, device, None)

    D, inter, d = dims.hidden_size, dims.intermediate_size, dims.head_dim
    q_out, kv_out = dims.num_heads * d, dims.num_kv_heads * d
    layers = []
    for i in range(dims.num_layers):
        p = f"layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        layers.append(
            LayerWeights(
                input_norm=norm(p + "input_layernorm.weight", D),
                qkv=linear(
                    [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"],
                    [(q_out, D), (kv_out, D), (kv_out, D)],
                ),
                o_proj=linear([a + "o_proj.weight"], [(D, q_out)]),
                q_norm=norm(a + "q_norm.weight", d, folded=True),
                k_norm=norm(a + "k_norm.weight", d, folded=True),
                post_attn_norm=norm(p + "post_attention_layernorm.weight", D),
                pre_ffn_norm=norm(p + "pre_feedforward_layernorm.weight", D),
                post_ffn_norm=norm(p + "post_feedforward_layernorm.weight", D),
                gate_up=linear([m + "gate_proj.weight", m + "up_proj.weight"], [(inter, D), (inter, D)]),
                down=linear([m + "down_proj.weight"], [(D, inter)]),
            )
        )
    embed_name = name("embed_tokens.weight")
    embed = store.get(embed_name, dtype=dtype, shape=(dims.vocab_size, D)).to(device)
    head = build_linear(
        store, [embed_name], [(dims.vocab_size, D)], weight_format, dtype, device, dense=embed, output_head=True
    )
    return Gemma3Weights(
        embed=embed, layers=tuple(layers), norm=norm("norm.weight", D), head=head, weight_format=weight_format
    )
