"""Weight loading for a decoder definition: every tensor through the ``WeightStore``, projections fused.

Owner: ``metrale_core.decoder``; ``build.build_decoder`` calls :func:`load_weights`.

Invariants:
- Tensor names come from the definition's weight-name table (``DecoderSpec.names``), resolved
  for the store at hand (HF names, or a GGUF store's; ``names.WeightNames.resolver``).
- Weights are read only through ``store.get(name, dtype=, shape=)`` with the shape the config
  implies, so a wrong checkpoint fails with ``ShapeMismatch`` naming the tensor.
- The output head is tied to the embedding when the config says so or the checkpoint has no head.
- Projections are fused at load time: ``qkv = [q; k; v]`` and ``gate_up = [gate; up]`` (read as
  one tensor where the checkpoint fuses them: ``Attention.fused_qkv``, ``Mlp.fused_gate_up``), and kept
  in the weight format of the shared linear layer (``build_linear``; ``auto`` by default: a GGUF
  stays in its blocks, its token table too (``build_embedding``)).
- Every projection LoRA may adapt is declared in ``DecoderWeights.lora`` as it is built: its path
  in the record (``layers.{i}.qkv``, ``layers.{i}.mla.q_a``, ``layers.{i}.o_proj.inner`` under
  tensor parallelism) and the checkpoint module paths it fuses (``layers.lora_targets``); the
  head and the MoE projections are not declared.
- Under tensor parallelism (``tp.world > 1``) the store is wrapped in a ``ShardedStore`` built by
  :func:`shard_plan`, so every projection is read as this rank's rows (q/k/v, gate/up, the
  vocabulary of the embedding and head) or columns (o_proj, down_proj) in any weight format; the
  row-parallel projections sum over the ranks (``RowParallelLinear``, their bias added once).
  A sparse layer's experts are split the same way, each expert's width over the ranks
  (``moe_weights.MoeSplit``: rows of its gate/up, columns of its down; the router whole), the
  block's output summed once; the ``ShardedStore`` wraps the expert stores, so an expert slice
  ``name[e]`` of a GGUF's stacked tensor is split as any tensor.
- A norm slot the recipe does not use is None in :class:`LayerWeights` and never read; so are the
  attention sinks (slot ``sinks``, ``[heads]``, read as float32-exact values in the model dtype)
  of a recipe without ``Attention.sinks``.
- A latent-attention layer (``dims.mla``) has ``mla`` (``mla.load_mla``) and no ``qkv``; its
  ``o_proj`` reads ``H * v_head_dim`` columns.
- A sparse layer (``dims.moe.sparse``) has ``moe`` (``moe_weights.load_moe``) and no dense
  ``gate_up`` / ``down``; a GGUF's stacked experts are read through ``ExpertSlices``, an HF
  MXFP4 checkpoint's (gpt-oss's ``*_blocks`` / ``*_scales``) through ``HfMxfp4Experts`` as GGUF
  MXFP4 blocks.  Its projections are not declared for LoRA: LoRA adapts attention and dense MLPs
  only; its routed experts are built ``lazy`` (``moe_weights``).
"""

from __future__ import annotations

from typing import Any

import torch
from attrs import field, frozen

from metrale_core.decoder.dims import DecoderDims
from metrale_core.decoder.mla import load_mla
from metrale_core.decoder.moe_weights import MoeSplit, load_moe, width_shard
from metrale_core.decoder.names import Resolver
from metrale_core.decoder.spec import DecoderSpec
from metrale_core.layers import build_embedding, build_linear, build_tied_head, embed_tokens
from metrale_core.layers.blocks.mla import MlaWeights
from metrale_core.layers.blocks.moe import MoeBlock
from metrale_core.layers.formats.linear import Linear
from metrale_core.layers.lowrank.lora_targets import LoRATarget, LoRATargets
from metrale_core.layers.parallel import (
    HeadSplit,
    ParallelHead,
    RowParallelLinear,
    Shard,
    ShardedStore,
    TensorParallel,
    VocabParallelEmbedding,
    split_heads,
    split_range,
)
from metrale_core.weights import ExpertSlices
from metrale_core.weights.mxfp4_hf import HfMxfp4Experts, is_hf_mxfp4

__all__ = ["DecoderWeights", "LayerWeights", "load_weights", "shard_plan"]


@frozen
class LayerWeights:
    """One decoder layer's tensors; projections are fused ``Linear`` objects (biases inside them)."""

    attn_norm: torch.Tensor | None
    #: The fused q/k/v projection (None in a latent-attention layer: ``mla``).
    qkv: Linear | None
    o_proj: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    attn_out_norm: torch.Tensor | None
    mlp_norm: torch.Tensor | None
    #: The dense MLP (None in a sparse layer).
    gate_up: Linear | None
    down: Linear | None
    mlp_out_norm: torch.Tensor | None
    #: A sparse layer's experts (None in a dense layer).
    moe: MoeBlock | None = None
    #: A latent-attention layer's projections (None in a GQA layer).
    mla: MlaWeights | None = None
    #: ``[heads]`` learned attention-sink logits (``Attention.sinks``; None: none).
    sinks: torch.Tensor | None = None

    @property
    def qkv_bias(self) -> torch.Tensor | None:
        return None if self.qkv is None else self.qkv.bias

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
    #: The projections LoRA may wrap, by their paths in this record (see the module docstring).
    lora: LoRATargets = field(factory=LoRATargets)


def shard_plan(
    dims: DecoderDims, tp: TensorParallel, name: Resolver
) -> tuple[dict[str, Shard], HeadSplit, tuple[int, ...], MoeSplit | None]:
    """Rank ``tp.rank``'s part of every split tensor, its heads, every rank's vocabulary rows and
    its part of the experts (None: no sparse layer)."""
    heads = split_heads(dims.num_heads, dims.num_kv_heads, tp.world, tp.rank)
    d = dims.head_dim
    q = Shard(0, heads.q_start * d, heads.num_heads * d)
    kv = Shard(0, heads.kv_start * d, heads.num_kv_heads * d)
    # no dense MLP (every layer sparse, ``intermediate_size`` 0): nothing to split
    mlp = width_shard(dims.intermediate_size, tp)
    vocab = [split_range(dims.vocab_size, tp.world, r) for r in range(tp.world)]
    rows = Shard(0, *vocab[tp.rank])
    plan: dict[str, Shard] = {name("embed", None, "weight"): rows, name("head", None, "weight"): rows}
    moe = None if dims.moe is None else MoeSplit.of(dims.moe, tp)
    for i in range(dims.num_layers):
        for kind in ("weight", "bias"):
            plan[name("q", i, kind)] = q
            plan[name("k", i, kind)] = plan[name("v", i, kind)] = kv
            plan[name("gate", i, kind)] = plan[name("up", i, kind)] = mlp
        plan[name("o", i, "weight")] = Shard(1, q.start, q.size)
        plan[name("down", i, "weight")] = Shard(1, mlp.start, mlp.size)
        if moe is not None and dims.moe is not None and dims.moe.sparse[i]:
            plan.update(moe.shards(dims.moe, name, i))
    return plan, heads, tuple(size for _, size in vocab), moe


def load_weights(
    spec: DecoderSpec,
    store: Any,
    dims: DecoderDims,
    dtype: torch.dtype,
    device: torch.device | str,
    weight_format: str = "auto",
    tp: TensorParallel | None = None,
) -> DecoderWeights:
    """Read, check and fuse every tensor the decoder needs, projections in ``weight_format``;
    with ``tp`` only this rank's part of each (see the module docstring)."""
    tp = tp if tp is not None else TensorParallel()
    n = spec.names.resolver(store)
    plan, heads, vocab_sizes, moe_split = shard_plan(dims, tp, n)
    if dims.moe is not None:  # a GGUF's stacked experts, served one expert at a time
        store = ExpertSlices(store)
        if is_hf_mxfp4(store):  # gpt-oss's HF *_blocks / *_scales, served as GGUF MXFP4 blocks
            store = HfMxfp4Experts(store)
    if tp.enabled:  # outermost: an expert slice is split as any tensor
        store = ShardedStore(store, plan, weight_format)

    lora: list[LoRATarget] = []

    def linear(slots: list[str], i: int, shapes: list[tuple[int, int]], bias: Any, at: tuple[str, ...]) -> Linear:
        """Layer ``i``'s projection fusing ``slots``, declared for LoRA at ``layers.{i}.{at}``."""
        names = [n(s, i, "weight") for s in slots]
        lora.append(LoRATarget.of(("layers", i, *at), names, shapes))
        return build_linear(store, names, shapes, weight_format, dtype, device, bias)

    def row_parallel(slot: str, i: int, shape: tuple[int, int], bias: torch.Tensor | None, at: str) -> Linear:
        """A projection whose input is split: its bias is added once, after the sum of the ranks."""
        if tp.enabled:
            return RowParallelLinear(linear([slot], i, [shape], None, (at, "inner")), tp, bias)
        return linear([slot], i, [shape], bias, (at,))

    def get(slot: str, i: int | None, shape: tuple[int, ...], kind: str = "weight") -> torch.Tensor:
        return store.get(n(slot, i, kind), dtype=dtype, shape=shape).to(device)

    def maybe(slot: str, i: int | None, shape: tuple[int, ...], present: bool, kind: str = "weight") -> Any:
        return get(slot, i, shape, kind) if present else None

    def biases(slots: list[str], i: int, sizes: list[int], present: bool) -> torch.Tensor | None:
        return torch.cat([get(s, i, (size,), "bias") for s, size in zip(slots, sizes)]) if present else None

    D, d, norms = dims.hidden_size, dims.head_dim, spec.norms
    inter = plan[n("down", 0, "weight")].size if dims.num_layers and tp.enabled else dims.intermediate_size
    q_out, kv_out = heads.num_heads * d, heads.num_kv_heads * d
    qk_norm = {"none": None, "head": (d, d), "proj": (q_out, kv_out)}[dims.qk_norm]
    V = vocab_sizes[tp.rank]
    layers = []
    qkv_slots, qkv_shapes = ["q", "k", "v"], [(q_out, D), (kv_out, D), (kv_out, D)]
    if spec.attention.fused_qkv:
        qkv_slots, qkv_shapes = ["qkv"], [(q_out + 2 * kv_out, D)]
    mlp_slots, mlp_shapes = ["gate", "up"], [(inter, D), (inter, D)]
    if spec.mlp.fused_gate_up:
        mlp_slots, mlp_shapes = ["gate_up"], [(2 * inter, D)]

    def built(
        names: list[str], shapes: list[tuple[int, int]], bias: torch.Tensor | None = None, lazy: bool = False
    ) -> Linear:
        """An MoE projection: not declared for LoRA (an expert sees a subset of the batch's rows,
        which the LoRA row map does not follow), so an adapter never wraps one; ``lazy``: GGUF
        blocks repacked on first use (a routed expert)."""
        return build_linear(store, names, shapes, weight_format, dtype, device, bias, lazy=lazy)

    def tensor(name: str, shape: tuple[int, ...], as_dtype: torch.dtype | None = None) -> torch.Tensor:
        return store.get(name, dtype=as_dtype or dtype, shape=shape).to(device)

    mla = dims.mla
    o_in = q_out if mla is None else mla.shape.heads * mla.shape.value
    for i in range(dims.num_layers):
        qkv_bias = biases(qkv_slots, i, [rows for rows, _ in qkv_shapes], dims.qkv_bias and mla is None)
        sparse = dims.moe is not None and dims.moe.sparse[i]
        gate_up_bias = biases(mlp_slots, i, [rows for rows, _ in mlp_shapes], dims.mlp_bias and not sparse)
        layers.append(
            LayerWeights(
                attn_norm=maybe("attn_norm", i, (D,), norms.pre_attn),
                qkv=linear(qkv_slots, i, qkv_shapes, qkv_bias, ("qkv",)) if mla is None else None,
                o_proj=row_parallel("o", i, (D, o_in), maybe("o", i, (D,), dims.o_bias, "bias"), "o_proj"),
                q_norm=None if qk_norm is None else get("q_norm", i, (qk_norm[0],)),
                k_norm=None if qk_norm is None else get("k_norm", i, (qk_norm[1],)),
                attn_out_norm=maybe("attn_out_norm", i, (D,), norms.post_attn),
                mlp_norm=maybe("mlp_norm", i, (D,), norms.pre_mlp),
                gate_up=None if sparse else linear(mlp_slots, i, mlp_shapes, gate_up_bias, ("gate_up",)),
                down=None
                if sparse
                else row_parallel("down", i, (D, inter), maybe("down", i, (D,), dims.mlp_bias, "bias"), "down"),
                mlp_out_norm=maybe("mlp_out_norm", i, (D,), norms.post_mlp),
                moe=load_moe(spec, dims, n, i, built, tensor, batch_invariant=weight_format != "exact", split=moe_split)
                if sparse
                else None,
                mla=None if mla is None else load_mla(mla, D, i, store, n, linear, get),
                sinks=maybe("sinks", i, (dims.num_heads,), spec.attention.sinks),
            )
        )
    embed_name, head_name = n("embed", None, "weight"), n("head", None, "weight")
    embed = build_embedding(store, embed_name, (V, D), weight_format, dtype, device)
    tied = dims.tie_word_embeddings or head_name not in store
    if tied:
        head: Any = build_tied_head(store, embed_name, embed, (V, D), weight_format, dtype, device)
        lm_head = embed if isinstance(embed, torch.Tensor) else None
    else:  # under exact the head's own dense tensor (build_embedding gives a tensor there too)
        lm_head = get("head", None, (V, D)) if weight_format == "exact" else None
        head = build_linear(store, [head_name], [(V, D)], weight_format, dtype, device, dense=lm_head, output_head=True)
    embedding = None
    if tp.enabled:
        head = ParallelHead(head, tp, vocab_sizes)
        embedding = VocabParallelEmbedding(embed, plan[embed_name].start, V, tp, embed_tokens)
    return DecoderWeights(
        embed=embed,
        layers=tuple(layers),
        norm=get("norm", None, (D,)),
        lm_head=lm_head,
        head=head,
        weight_format=weight_format,
        embedding=embedding,
        heads=heads,
        lora=LoRATargets(tuple(lora)),
    )
