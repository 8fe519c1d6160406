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
- Under tensor parallelism (``tp.world > 1``) the store is wrapped in a ``ShardedStore`` built by
  :func:`shard_plan` (q/k/v, gate/up and the vocabulary rows on dim 0, o/down on dim 1, in any
  weight format); the norms are whole on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from attrs import frozen

from metrale_core.api import (
    ConfigError,
    HeadSplit,
    Linear,
    ParallelHead,
    RowParallelLinear,
    Shard,
    ShardedStore,
    TensorParallel,
    VocabParallelEmbedding,
    build_embedding,
    build_linear,
    build_tied_head,
    embed_tokens,
    split_heads,
    split_range,
    split_unit,
)
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
    #: The token table: a tensor, or (``auto`` on a quantized GGUF) its blocks read in place.
    embed: Any
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    head: Linear
    weight_format: str = "exact"
    #: ``ids -> rows`` of the vocab-parallel token table (tensor parallelism); None: ``F.embedding``.
    embedding: Any = None
    #: The attention heads this rank keeps (all of them without tensor parallelism).
    heads: HeadSplit | None = None


def shard_plan(
    name: Callable[[str], str], dims: Gemma3Dims, tp: TensorParallel
) -> tuple[dict[str, Shard], HeadSplit, tuple[int, ...]]:
    """Rank ``tp.rank``'s part of every split tensor (by store name), its heads, every rank's vocabulary rows."""
    heads = split_heads(dims.num_heads, dims.num_kv_heads, tp.world, tp.rank)
    d, inter = dims.head_dim, dims.intermediate_size
    q = Shard(0, heads.q_start * d, heads.num_heads * d)
    kv = Shard(0, heads.kv_start * d, heads.num_kv_heads * d)
    mlp = Shard(0, *split_range(inter, tp.world, tp.rank, split_unit(inter, tp.world)))
    vocab = [split_range(dims.vocab_size, tp.world, r) for r in range(tp.world)]
    plan = {name("embed_tokens.weight"): Shard(0, *vocab[tp.rank])}
    for i in range(dims.num_layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        plan[name(a + "q_proj.weight")] = q
        plan[name(a + "k_proj.weight")] = plan[name(a + "v_proj.weight")] = kv
        plan[name(m + "gate_proj.weight")] = plan[name(m + "up_proj.weight")] = mlp
        plan[name(a + "o_proj.weight")] = Shard(1, q.start, q.size)
        plan[name(m + "down_proj.weight")] = Shard(1, mlp.start, mlp.size)
    return plan, heads, tuple(size for _, size in vocab)


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
    store: Any,
    dims: Gemma3Dims,
    dtype: torch.dtype,
    device: torch.device | str,
    weight_format: str = "exact",
    tp: TensorParallel | None = None,
) -> Gemma3Weights:
    """Read, check and fuse every tensor of the decoder, projections in ``weight_format``; with
    ``tp`` only this rank's part of each (``shard_plan``; row-parallel o/down sum over the ranks)."""
    name = tensor_names(store, dims)
    tp = tp if tp is not None else TensorParallel()
    plan, heads, vocab_sizes = shard_plan(name, dims, tp)
    if tp.enabled:
        store = ShardedStore(store, plan, weight_format)
    shift = 1.0 if dims.norm_offset_stored else 0.0

    def norm(suffix: str, size: int, *, folded: bool = False) -> torch.Tensor:
        w = store.get(name(suffix), dtype=torch.float32, shape=(size,)) - shift
        return (1.0 + w if folded else w).to(dtype).to(device)

    def linear(suffixes: list[str], shapes: list[tuple[int, int]]) -> Linear:
        return build_linear(store, [name(s) for s in suffixes], shapes, weight_format, dtype, device, None)

    def row_parallel(suffixes: list[str], shapes: list[tuple[int, int]]) -> Linear:
        inner = linear(suffixes, shapes)
        return RowParallelLinear(inner, tp) if tp.enabled else inner

    D, d = dims.hidden_size, dims.head_dim
    inter = (
        plan[name("layers.0.mlp.down_proj.weight")].size if tp.enabled and dims.num_layers else dims.intermediate_size
    )
    q_out, kv_out = heads.num_heads * d, heads.num_kv_heads * d
    V = vocab_sizes[tp.rank]
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
                o_proj=row_parallel([a + "o_proj.weight"], [(D, q_out)]),
                q_norm=norm(a + "q_norm.weight", d, folded=True),
                k_norm=norm(a + "k_norm.weight", d, folded=True),
                post_attn_norm=norm(p + "post_attention_layernorm.weight", D),
                pre_ffn_norm=norm(p + "pre_feedforward_layernorm.weight", D),
                post_ffn_norm=norm(p + "post_feedforward_layernorm.weight", D),
                gate_up=linear([m + "gate_proj.weight", m + "up_proj.weight"], [(inter, D), (inter, D)]),
                down=row_parallel([m + "down_proj.weight"], [(D, inter)]),
            )
        )
    embed_name = name("embed_tokens.weight")
    embed = build_embedding(store, embed_name, (V, D), weight_format, dtype, device)
    head: Any = build_tied_head(store, embed_name, embed, (V, D), weight_format, dtype, device)
    embedding = None
    if tp.enabled:
        head = ParallelHead(head, tp, vocab_sizes)
        embedding = VocabParallelEmbedding(embed, plan[embed_name].start, V, tp, embed_tokens)
    return Gemma3Weights(
        embed=embed,
        layers=tuple(layers),
        norm=norm("norm.weight", D),
        head=head,
        weight_format=weight_format,
        embedding=embedding,
        heads=heads,
    )
