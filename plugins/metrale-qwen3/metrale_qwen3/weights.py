"""Weight loading through the ``WeightStore``: every tensor of one decoder, projections fused.

Owner: ``metrale_qwen3``; ``loader.load_model`` calls :func:`load_weights`.

Invariants:
- Weights are read only through ``store.get(name, dtype=, shape=)`` with the shape the config
  implies, so a wrong checkpoint fails with ``ShapeMismatch`` naming the tensor.
- The output head is tied to the embedding when the config says so or the checkpoint has no
  ``lm_head.weight``.
- Projections are fused at load time: ``qkv = [q; k; v]`` and ``gate_up = [gate; up]``, and kept
  in the weight format of the shared linear layer (``metrale_core.layers.build_linear``;
  ``auto`` by default: a GGUF stays in its blocks, its token table too (``build_embedding``)).
"""

from __future__ import annotations

from typing import Any

import torch
from attrs import frozen

from metrale_core.api import Linear, build_embedding, build_linear
from metrale_qwen3.dims import ModelDims

__all__ = ["DecoderWeights", "LayerWeights", "load_weights"]


@frozen
class LayerWeights:
    """One decoder layer's tensors; projections are fused ``Linear`` objects (biases inside them)."""

    input_norm: torch.Tensor
    qkv: Linear
    o_proj: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear

    @property
    def qkv_bias(self) -> torch.Tensor | None:
        return self.qkv.bias

    @property
    def o_bias(self) -> torch.Tensor | None:
        return self.o_proj.bias


@frozen
class DecoderWeights:
    #: The token table: a tensor, or a quantized GGUF table read in place (``embed_tokens``).
    embed: Any
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    #: The dense output matrix (the embedding itself when tied); None when only ``head`` keeps it.
    lm_head: torch.Tensor | None
    #: The output head as the forward runs it.
    head: Linear
    #: The weight format the projections are kept in (``metrale_core.layers.WEIGHT_FORMATS``).
    weight_format: str = "exact"


def load_weights(store: Any, dims: ModelDims, dtype: torch.dtype,
                 device: torch.device | str, weight_format: str = "auto") -> DecoderWeights:
    """Read, check and fuse every tensor the decoder needs, projections in ``weight_format``."""

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return store.get(name, dtype=dtype, shape=shape).to(device)

    def maybe(name: str, shape: tuple[int, ...], present: bool) -> torch.Tensor | None:
        return get(name, shape) if present else None

    def linear(names: list[str], shapes: list[tuple[int, int]], bias: torch.Tensor | None) -> Linear:
        return build_linear(store, names, shapes, weight_format, dtype, device, bias)

    D, inter, d = dims.hidden_size, dims.intermediate_size, dims.head_dim
    q_out, kv_out = dims.num_heads * d, dims.num_kv_heads * d
    layers = []
    for i in range(dims.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        qkv_bias = None
        if dims.qkv_bias:
            qkv_bias = torch.cat([get(a + "q_proj.bias", (q_out,)), get(a + "k_proj.bias", (kv_out,)),
                                  get(a + "v_proj.bias", (kv_out,))])
        qkv = linear([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"],
                     [(q_out, D), (kv_out, D), (kv_out, D)], qkv_bias)
        gate_up_bias = None
        if dims.mlp_bias:
            gate_up_bias = torch.cat([get(m + "gate_proj.bias", (inter,)), get(m + "up_proj.bias", (inter,))])
        gate_up = linear([m + "gate_proj.weight", m + "up_proj.weight"], [(inter, D), (inter, D)], gate_up_bias)
        layers.append(LayerWeights(
            input_norm=get(p + "input_layernorm.weight", (D,)), qkv=qkv,
            o_proj=linear([a + "o_proj.weight"], [(D, q_out)], maybe(a + "o_proj.bias", (D,), dims.o_bias)),
            q_norm=maybe(a + "q_norm.weight", (d,), dims.qk_norm),
            k_norm=maybe(a + "k_norm.weight", (d,), dims.qk_norm),
            post_norm=get(p + "post_attention_layernorm.weight", (D,)), gate_up=gate_up,
            down=linear([m + "down_proj.weight"], [(D, inter)], maybe(m + "down_proj.bias", (D,), dims.mlp_bias))))
    embed = build_embedding(store, "model.embed_tokens.weight", (dims.vocab_size, D), weight_format, dtype, device)
    tied = dims.tie_word_embeddings or "lm_head.weight" not in store
    head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    if isinstance(embed, torch.Tensor) and (tied or weight_format == "exact"):
        lm_head = embed if tied else get("lm_head.weight", (dims.vocab_size, D))
        head = build_linear(store, [head_name], [(dims.vocab_size, D)], weight_format, dtype, device,
                            dense=lm_head, output_head=True)
    else:
        lm_head = None
        head = build_linear(store, [head_name], [(dims.vocab_size, D)], weight_format, dtype, device,
                            output_head=True)
    return DecoderWeights(embed=embed, layers=tuple(layers), norm=get("model.norm.weight", (D,)),
                          lm_head=lm_head, head=head, weight_format=weight_format)
