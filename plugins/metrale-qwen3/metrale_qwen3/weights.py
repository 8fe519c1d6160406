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
- Under tensor parallelism (``tp.world > 1``) the store is wrapped in a ``ShardedStore`` built by
  :func:`shard_plan`, so every projection is read as this rank's rows (q/k/v, gate/up, the
  vocabulary of the embedding and head) or columns (o_proj, down_proj) in any weight format; the
  row-parallel projections sum over the ranks (``RowParallelLinear``, their bias added once).
"""

from __future__ import annotations

from typing import Any

import torch
from attrs import frozen

from metrale_core.api import (
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
from metrale_qwen3.dims import ModelDims

__all__ = ["DecoderWeights", "LayerWeights", "load_weights", "shard_plan"]


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
    #: ``ids -> rows`` of the (vocab-parallel) token table; None: ``embed_tokens(ids, embed)``.
    embedding: Any = None
    #: The attention heads this rank keeps (all of them without tensor parallelism).
    heads: HeadSplit | None = None


def shard_plan(dims: ModelDims, tp: TensorParallel) -> tuple[dict[str, Shard], HeadSplit, tuple[int, ...]]:
    """Rank ``tp.rank``'s part of every split tensor, its heads, and every rank's vocabulary rows."""
    heads = split_heads(dims.num_heads, dims.num_kv_heads, tp.world, tp.rank)
    d, inter = dims.head_dim, dims.intermediate_size
    q = Shard(0, heads.q_start * d, heads.num_heads * d)
    kv = Shard(0, heads.kv_start * d, heads.num_kv_heads * d)
    mlp_start, mlp_size = split_range(inter, tp.world, tp.rank, split_unit(inter, tp.world))
    vocab = [split_range(dims.vocab_size, tp.world, r) for r in range(tp.world)]
    rows = Shard(0, *vocab[tp.rank])
    plan: dict[str, Shard] = {"model.embed_tokens.weight": rows, "lm_head.weight": rows}
    for i in range(dims.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        for kind in ("weight", "bias"):
            plan[f"{a}q_proj.{kind}"] = q
            plan[f"{a}k_proj.{kind}"] = plan[f"{a}v_proj.{kind}"] = kv
            plan[f"{m}gate_proj.{kind}"] = plan[f"{m}up_proj.{kind}"] = Shard(0, mlp_start, mlp_size)
        plan[f"{a}o_proj.weight"] = Shard(1, q.start, q.size)
        plan[f"{m}down_proj.weight"] = Shard(1, mlp_start, mlp_size)
    return plan, heads, tuple(size for _, size in vocab)


def load_weights(
    store: Any,
    dims: ModelDims,
    dtype: torch.dtype,
    device: torch.device | str,
    weight_format: str = "auto",
    tp: TensorParallel | None = None,
) -> DecoderWeights:
    """Read, check and fuse every tensor the decoder needs, projections in ``weight_format``;
    with ``tp`` only this rank's part of each (see the module docstring)."""
    tp = tp if tp is not None else TensorParallel()
    plan, heads, vocab_sizes = shard_plan(dims, tp)
    if tp.enabled:
        store = ShardedStore(store, plan, weight_format)

    def linear(names: list[str], shapes: list[tuple[int, int]], bias: torch.Tensor | None) -> Linear:
        return build_linear(store, names, shapes, weight_format, dtype, device, bias)

    def row_parallel(names: list[str], shapes: list[tuple[int, int]], bias: torch.Tensor | None) -> Linear:
        """A projection whose input is split: its bias is added once, after the sum of the ranks."""
        if tp.enabled:
            return RowParallelLinear(linear(names, shapes, None), tp, bias)
        return linear(names, shapes, bias)

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return store.get(name, dtype=dtype, shape=shape).to(device)

    def maybe(name: str, shape: tuple[int, ...], present: bool) -> torch.Tensor | None:
        return get(name, shape) if present else None

    D, d = dims.hidden_size, dims.head_dim
    inter = (
        plan["model.layers.0.mlp.down_proj.weight"].size if dims.num_layers and tp.enabled else dims.intermediate_size
    )
    q_out, kv_out = heads.num_heads * d, heads.num_kv_heads * d
    V = vocab_sizes[tp.rank]
    layers = []
    for i in range(dims.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        qkv_bias = None
        if dims.qkv_bias:
            qkv_bias = torch.cat(
                [get(a + "q_proj.bias", (q_out,)), get(a + "k_proj.bias", (kv_out,)), get(a + "v_proj.bias", (kv_out,))]
            )
        qkv = linear(
            [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"],
            [(q_out, D), (kv_out, D), (kv_out, D)],
            qkv_bias,
        )
        gate_up_bias = None
        if dims.mlp_bias:
            gate_up_bias = torch.cat([get(m + "gate_proj.bias", (inter,)), get(m + "up_proj.bias", (inter,))])
        gate_up = linear([m + "gate_proj.weight", m + "up_proj.weight"], [(inter, D), (inter, D)], gate_up_bias)
        layers.append(
            LayerWeights(
                input_norm=get(p + "input_layernorm.weight", (D,)),
                qkv=qkv,
                o_proj=row_parallel([a + "o_proj.weight"], [(D, q_out)], maybe(a + "o_proj.bias", (D,), dims.o_bias)),
                q_norm=maybe(a + "q_norm.weight", (d,), dims.qk_norm),
                k_norm=maybe(a + "k_norm.weight", (d,), dims.qk_norm),
                post_norm=get(p + "post_attention_layernorm.weight", (D,)),
                gate_up=gate_up,
                down=row_parallel(
                    [m + "down_proj.weight"], [(D, inter)], maybe(m + "down_proj.bias", (D,), dims.mlp_bias)
                ),
            )
        )
    embed = build_embedding(store, "model.embed_tokens.weight", (V, D), weight_format, dtype, device)
    tied = dims.tie_word_embeddings or "lm_head.weight" not in store
    head_name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    if tied:
        head: Any = build_tied_head(store, head_name, embed, (V, D), weight_format, dtype, device)
        lm_head = embed if isinstance(embed, torch.Tensor) else None
    else:  # under exact the head's own dense tensor (build_embedding gives a tensor there too)
        lm_head = get("lm_head.weight", (V, D)) if weight_format == "exact" else None
        head = build_linear(store, [head_name], [(V, D)], weight_format, dtype, device, dense=lm_head, output_head=True)
    embedding = None
    if tp.enabled:
        head = ParallelHead(head, tp, vocab_sizes)
        embedding = VocabParallelEmbedding(embed, plan["model.embed_tokens.weight"].start, V, tp, embed_tokens)
    return DecoderWeights(
        embed=embed,
        layers=tuple(layers),
        norm=get("model.norm.weight", (D,)),
        lm_head=lm_head,
        head=head,
        weight_format=weight_format,
        embedding=embedding,
        heads=heads,
    )
