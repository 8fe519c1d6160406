"""Weight loading of one sparse (MoE) layer of a decoder definition -> a ``MoeBlock``.

Owner: ``metrale_core.decoder``; ``weights.load_weights`` calls :func:`load_moe` for each layer
``dims.moe.sparse`` marks.

Invariants:
- Every projection -- the router, each routed expert's fused ``[gate; up]`` and ``down``, the
  shared expert's and its gate -- is built by the decoder's own ``build`` (the shared linear
  layer, any weight format; not declared for LoRA), so a GGUF expert stays in its blocks and runs on
  the GGUF kernels; no expert is dequantized under ``auto``.
- Under ``auto`` a GGUF's routed experts are built ``lazy``: loading keeps views of the mapped
  file and reads none of their pages; an expert is repacked (into the file-backed repack cache)
  on its first call, when the router first picks it, so a file larger than free RAM serves and
  memory follows the experts in use.  The records are an eager load's, so the results (and their
  batch invariance) are the same bits.  The shared expert and the router are built at load.
- Names come from the definition's table: an HF checkpoint's experts are ``...experts.{e}...``
  tensors, a GGUF's are slices ``name[e]`` of the stacked ``ffn_*_exps`` tensors, which the
  store wrapped in ``metrale_core.weights.ExpertSlices`` serves as views of the mapped file.
- Outside ``exact`` a dense router / shared-expert gate (F32 in llama.cpp's files) is a
  ``RowwiseLinear`` and the sigmoids run row by row, so the whole block stays batch-invariant.
- Shapes are those the config implies (``ShapeMismatch`` naming the tensor otherwise).
- The router's correction bias (``MoeDims.router_bias``) is read in float32 whatever the
  activation dtype (transformers keeps it a float32 buffer), with the routing's groups and scale.
- With ``dims.mlp_bias`` (gpt-oss) the router and every expert projection carry their biases
  (slot ``bias`` of the same names; a GGUF stacks them ``[E, rows]``, served per expert), added
  by the projection itself (batch-invariant: an elementwise add).
- Under tensor parallelism (:class:`MoeSplit`, its shards in the decoder's ``ShardedStore``) each
  rank keeps a range of every expert's width, as of a dense MLP: rows of each routed expert's
  and the shared expert's gate/up (and their biases), the matching input columns of their down;
  the router, its correction bias and the shared expert's gate are whole on every rank (every
  rank routes the same rows to the same experts).  The block's output is summed over the ranks
  once (``MoeBlock.tp``: one all-reduce per sparse layer); a down projection's bias is read on
  rank 0 only, so it is added once.  A routed expert stays ``lazy`` on each rank's part.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from attrs import frozen

from metrale_core.decoder.dims import DecoderDims
from metrale_core.decoder.moe_dims import MoeDims
from metrale_core.decoder.names import Resolver
from metrale_core.decoder.spec import DecoderSpec
from metrale_core.layers.blocks.moe import Expert, Groups, MoeBlock, RowwiseLinear
from metrale_core.layers.formats.linear import Linear
from metrale_core.layers.formats.linear_kinds import DenseLinear
from metrale_core.layers.parallel import Shard, TensorParallel, split_range, split_unit

__all__ = ["MoeSplit", "load_moe", "width_shard"]

#: The slots of a routed expert and of the shared one: ``(gate, up, down)``.
ROUTED = ("expert_gate", "expert_up", "expert_down")
SHARED = ("shared_gate", "shared_up", "shared_down")

#: ``(names, shapes, bias[, lazy]) -> Linear``: the decoder's projection builder (fused along
#: rows; ``lazy``: GGUF blocks repacked on first use).
Build = Callable[..., Linear]
#: ``(name, shape, dtype) -> tensor``: a tensor of the store on the model's device, in ``dtype``
#: (None: the model's; the router's correction bias is read in float32).
Get = Callable[[str, tuple[int, ...], "torch.dtype | None"], torch.Tensor]


def width_shard(width: int, tp: TensorParallel) -> Shard:
    """Rank ``tp.rank``'s rows of a gated MLP of ``width`` (its gate / up rows; the same range of
    its down's columns), split between quantization blocks (``split_unit``); none of no width."""
    if not width:
        return Shard(0, 0, 0)
    return Shard(0, *split_range(width, tp.world, tp.rank, split_unit(width, tp.world)))


@frozen
class MoeSplit:
    """This rank's part of every sparse layer (module docstring): the rows of each routed
    expert's width and of the shared expert's."""

    routed: Shard
    shared: Shard
    tp: TensorParallel

    @classmethod
    def of(cls, moe: MoeDims, tp: TensorParallel) -> MoeSplit:
        return cls(width_shard(moe.intermediate_size, tp), width_shard(moe.shared_intermediate_size, tp), tp)

    def shards(self, moe: MoeDims, n: Resolver, layer: int) -> dict[str, Shard]:
        """The ``ShardedStore`` entries of layer ``layer``'s experts (the router is not split)."""
        plan: dict[str, Shard] = {}

        def expert(slots: tuple[str, str, str], rows: Shard, e: int | None = None) -> None:
            for kind in ("weight", "bias"):
                plan[n(slots[0], layer, kind, e)] = plan[n(slots[1], layer, kind, e)] = rows
            plan[n(slots[2], layer, "weight", e)] = Shard(1, rows.start, rows.size)

        for e in range(moe.num_experts):
            expert(ROUTED, self.routed, e)
        if moe.shared_intermediate_size:
            expert(SHARED, self.shared)
        return plan


def load_moe(
    spec: DecoderSpec,
    dims: DecoderDims,
    n: Resolver,
    layer: int,
    build: Build,
    get: Get,
    *,
    batch_invariant: bool,
    split: MoeSplit | None = None,
) -> MoeBlock:
    """Layer ``layer``'s MoE block (``dims.moe`` set); ``batch_invariant``: a dense router or
    shared-expert gate runs one row at a time (every format but ``exact``, whose dense products
    are transformers' own); ``split``: this rank's part under tensor parallelism (None: all)."""
    moe = dims.moe
    assert moe is not None, "load_moe reads a definition with Mlp(kind='moe')"
    split = split if split is not None else MoeSplit.of(moe, TensorParallel())
    D, i = dims.hidden_size, layer

    def bias(slots: tuple[str, ...], sizes: tuple[int, ...], e: int | None = None) -> torch.Tensor | None:
        if not dims.mlp_bias:
            return None
        return torch.cat([get(n(s, i, "bias", e), (size,), None) for s, size in zip(slots, sizes)])

    def small(slot: str, rows: int) -> Linear:
        linear = build([n(slot, i, "weight")], [(rows, D)], bias((slot,), (rows,)))
        if batch_invariant and isinstance(linear, DenseLinear):
            return RowwiseLinear(linear.weight, linear.bias)
        return linear

    def expert(slots: tuple[str, str, str], size: int, e: int | None = None) -> Expert:
        gate, up, down = (n(s, i, "weight", e) for s in slots)
        lazy = e is not None  # a routed expert: paged in when first routed to; the shared one always runs
        once = bias(slots[2:], (D,), e) if split.tp.rank == 0 else None  # summed over the ranks: rank 0's
        return Expert(
            gate_up=build([gate, up], [(size, D), (size, D)], bias(slots[:2], (size, size), e), lazy=lazy),
            down=build([down], [(D, size)], once, lazy=lazy),
        )

    experts = tuple(expert(ROUTED, split.routed.size, e) for e in range(moe.num_experts))
    shared = shared_gate = None
    if moe.shared_intermediate_size:
        shared = expert(SHARED, split.shared.size)
        if spec.mlp.shared_gate:
            shared_gate = small("shared_expert_gate", 1)
    return MoeBlock(
        router=small("router", moe.num_experts),
        experts=experts,
        top_k=moe.top_k,
        scoring=moe.scoring,
        normalize=moe.normalize,
        bias=get(n("router_bias", i, "bias"), (moe.num_experts,), torch.float32) if moe.router_bias else None,
        shared=shared,
        shared_gate=shared_gate,
        rowwise=batch_invariant,
        groups=Groups(moe.groups, moe.topk_groups, moe.group_score) if moe.groups > 1 else None,
        scale=moe.scale,
        tp=split.tp if split.tp.enabled else None,
    )
