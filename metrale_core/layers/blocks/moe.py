"""A mixture-of-experts MLP over the shared linear layer: routing, grouped experts, shared experts.

Owner: ``metrale_core.layers``; the decoder definition builds one :class:`MoeBlock` per sparse
layer (``metrale_core.decoder.moe_weights``).

The block computes, per row ``x``::

    scores  = softmax(router(x))  or  sigmoid(router(x))          (float32)
    choice  = scores + bias               (bias: optional selection-only correction bias)
    choice  = choice outside the best ``topk_groups`` of ``groups`` expert groups set to -inf
              (a group ranked by its best choice, or by its two best summed: ``group_score``)
    ids     = top_k(choice)
    w       = scores[ids]  (divided by their sum with ``normalize``), times ``scale``
              or, ``topk_softmax`` (gpt-oss): ids = top_k(router(x)), w = softmax(router(x)[ids])
    routed  = sum_j  w_j * down_e(act(gate_up_e(x))),   e = ids_j, j = 0 .. k-1 in top-k order
    shared  = down_s(act(gate_up_s(x))) (times sigmoid(shared_gate(x)) where there is one)
    y       = routed + shared

Tokens are grouped per expert: the ``T * k`` (row, slot) pairs are sorted by expert (stable),
each active expert multiplies its rows in one call of its own projections (any weight format of
``linear.build_linear``: a GGUF expert stays in its blocks and runs on the GGUF kernels), and each
result, times its weight, goes back to its (row, slot) place; the slots are then summed in slot
order.

Invariants:
- Batch-invariant where the projections and the activation are (the GGUF kernels, ``gguf_linear``;
  the C SwiGLU; a dense router or shared-expert gate outside ``exact`` is a :class:`RowwiseLinear`)
  and with ``rowwise`` (the sigmoids row by row): a row's experts, weights and sum order depend
  only on that row -- the slot sum runs in a fixed order, never through ``index_add_`` -- so a
  row's result is the same bits alone and in any batch.
- No expert is copied or dequantized here; only the rows routed to an expert reach it.
- Routing runs in float32 whatever the activation dtype (as transformers), the weights are cast
  back to the activation dtype before they scale the expert outputs.
- Under tensor parallelism (``tp``) every rank routes the same (the router is whole on each) and
  its experts give their part of the sum, which one all-reduce completes, after the shared expert.
- :func:`swiglu_oai` is gpt-oss's clamped SwiGLU over the fused ``[gate; up]`` halves (the loader
  de-interleaves HF's ``gate_up_proj`` columns); its sigmoid runs row by row with ``rowwise``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from attrs import frozen

from metrale_core.layers.formats.linear_kinds import Matrix
from metrale_core.layers.formats.rows_matmul import rows_matmul

__all__ = ["Expert", "Groups", "MoeBlock", "RowwiseLinear", "grouped_experts", "route", "sigmoid", "swiglu_oai"]

Scoring = Literal["softmax", "sigmoid", "topk_softmax"]
#: At most this many (row, slot) pairs in a step: each pair's expert is called on its row directly.
FEW_PAIRS = 16
GroupScore = Literal["max", "top2"]


def sigmoid(x: torch.Tensor, rowwise: bool = False) -> torch.Tensor:
    """``torch.sigmoid(x)``; ``rowwise``: one row ``x[t]`` at a time, so every row takes the same
    vector / scalar path whatever the row count (torch's elementwise kernels run the tail of a
    tensor through the scalar function, whose bits differ from the vector one's)."""
    if not rowwise or x.shape[0] == 0:
        return torch.sigmoid(x)
    return torch.stack([torch.sigmoid(row) for row in x.unbind(0)])


@frozen
class Groups:
    """Group-limited top-k (DeepSeek): the experts split into ``count`` equal groups, a row
    chooses among the best ``keep`` groups, each ranked by its best choice score (``max``,
    DeepSeek-V2's ``group_limited_greedy``) or its two best summed (``top2``, V3's ``noaux_tc``)."""

    count: int
    keep: int
    score: GroupScore = "max"


def _limit_groups(choice: torch.Tensor, groups: Groups) -> torch.Tensor:
    """``choice`` ``[T, E]`` with every expert outside its row's best groups set to ``-inf``."""
    rows, experts = choice.shape
    grouped = choice.view(rows, groups.count, experts // groups.count)
    rank = grouped.max(dim=-1).values if groups.score == "max" else grouped.topk(2, dim=-1).values.sum(dim=-1)
    keep = torch.zeros_like(rank, dtype=torch.bool).scatter_(1, rank.topk(groups.keep, dim=-1).indices, True)
    return grouped.masked_fill(~keep[:, :, None], float("-inf")).view(rows, experts)


def swiglu_oai(x: torch.Tensor, alpha: float, limit: float, rowwise: bool = False) -> torch.Tensor:
    """gpt-oss's SwiGLU of the fused ``[gate; up]`` ``[T, 2I]`` -> ``[T, I]``: gate clamped above at
    ``limit``, up to ``[-limit, limit]``, ``(up + 1) * gate * sigmoid(alpha * gate)``
    (transformers' ``GptOssExperts._apply_gate``, op for op)."""
    gate, up = x.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * sigmoid(gate * alpha, rowwise))


def route(
    logits: torch.Tensor,
    top_k: int,
    scoring: Scoring = "softmax",
    normalize: bool = False,
    bias: torch.Tensor | None = None,
    rowwise: bool = False,
    groups: Groups | None = None,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing of router ``logits`` ``[T, E]``: weights ``[T, k]`` (float32) and expert ids
    ``[T, k]``, best first (``topk_softmax``: softmax over the top-k logits).  ``bias`` ``[E]`` is
    added to the scores for the choice only (the weights are the unbiased scores, DeepSeek-V3's
    correction bias); ``groups`` limits the choice to the best groups; the weights are multiplied
    by ``scale`` last; ``rowwise``: sigmoid scores row by row (:func:`sigmoid`; softmax, top-k and
    the renormalisation are per row already)."""
    if scoring == "topk_softmax":
        top, ids = torch.topk(logits.float(), top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
        return (weights * scale if scale != 1.0 else weights), ids
    if scoring == "softmax":
        scores = torch.softmax(logits.float(), dim=-1)
    elif scoring == "sigmoid":
        scores = sigmoid(logits.float(), rowwise)
    else:
        raise ValueError(f"unknown router scoring {scoring!r} (softmax, sigmoid or topk_softmax)")
    if bias is None and (groups is None or groups.count == 1):
        weights, ids = torch.topk(scores, top_k, dim=-1)
    else:
        choice = scores if bias is None else scores + bias.float()
        if groups is not None and groups.count > 1:
            choice = _limit_groups(choice, groups)
        _, ids = torch.topk(choice, top_k, dim=-1)
        weights = scores.gather(-1, ids)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if scale != 1.0:
        weights = weights * scale
    return weights, ids


@frozen
class RowwiseLinear(Matrix):
    """A small dense matrix (the router, the shared expert's gate: llama.cpp keeps them F32)
    multiplied so that each row's result does not depend on the batch (``rows_matmul``: a C kernel
    with a fixed order of sums, else one-row products), batch-invariant as the GGUF kernels'
    (``F.linear`` of a whole batch is not: its order of sums follows the row count).  ``bias``
    (gpt-oss's router) is added to every row in the activation dtype."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = rows_matmul(x.to(self.weight.dtype), self.weight).to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)


@frozen
class Expert:
    """One gated MLP: ``down(act(gate_up(x)))`` with ``gate_up`` the fused ``[gate; up]`` projection."""

    gate_up: Any
    down: Any

    def __call__(self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return self.down(act(self.gate_up(x)))


def grouped_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: Sequence[Expert],
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``sum_j weights[:, j] * experts[ids[:, j]](x)`` ``[T, D]``, each active expert called once
    on its rows (module docstring: grouped, summed in slot order).  A step of at most
    :data:`FEW_PAIRS` (row, slot) pairs (decode) calls each pair's expert on its row directly --
    no sort, gather or scatter -- with the same products and the same slot-order sum, so the
    same bits."""
    rows, k = ids.shape
    if rows * k <= FEW_PAIRS:
        return _pair_by_pair(x, weights, ids, experts, act)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=len(experts)).tolist()
    scale = weights.reshape(-1, 1).to(x.dtype)
    out = x.new_zeros(rows * k, x.shape[-1])
    start = 0
    for e, count in enumerate(counts):
        if not count:
            continue
        pairs = order[start : start + count]
        start += count
        out[pairs] = experts[e](x[pairs // k], act) * scale[pairs]
    out = out.view(rows, k, x.shape[-1])
    y = out[:, 0]
    for j in range(1, k):
        y = y + out[:, j]
    return y


def _pair_by_pair(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: Sequence[Expert],
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """:func:`grouped_experts` of a few pairs, one expert call per (row, slot)."""
    scale = weights.to(x.dtype)
    out = []
    for t, row_ids in enumerate(ids.tolist()):
        xt = x[t : t + 1]
        y = experts[row_ids[0]](xt, act) * scale[t : t + 1, 0:1]
        for j in range(1, len(row_ids)):
            y = y + experts[row_ids[j]](xt, act) * scale[t : t + 1, j : j + 1]
        out.append(y)
    return torch.cat(out) if out else x.new_zeros(0, x.shape[-1])


@frozen
class MoeBlock:
    """A sparse MLP layer; see the module docstring."""

    #: ``x -> logits [T, E]``.
    router: Any
    experts: tuple[Expert, ...]
    top_k: int
    scoring: Scoring = "softmax"
    normalize: bool = False
    #: Selection-only correction bias ``[E]`` (None: none).
    bias: torch.Tensor | None = None
    #: The shared expert(s), fused into one MLP (None: none).
    shared: Expert | None = None
    #: ``x -> [T, 1]``: the shared expert's output times ``sigmoid`` of it (Qwen2-MoE).
    shared_gate: Any = None
    #: Batch-invariant: the sigmoids run row by row (:func:`sigmoid`).
    rowwise: bool = False
    #: Group-limited top-k (None: every expert is a candidate).
    groups: Groups | None = None
    #: The routing weights' multiplier (DeepSeek's ``routed_scaling_factor``).
    scale: float = 1.0
    #: Tensor parallelism: the experts hold this rank's part of their widths, the output is summed
    #: over the ranks (``TensorParallel.all_reduce``, once per block); None: the whole block here.
    tp: Any = None

    def __call__(self, x: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``x [T, D] -> [T, D]``; ``act`` is the gated activation of the fused ``[T, 2I]``
        gate/up output (the model's SwiGLU op)."""
        weights, ids = route(
            self.router(x), self.top_k, self.scoring, self.normalize, self.bias, self.rowwise, self.groups, self.scale
        )
        y = grouped_experts(x, weights, ids, self.experts, act)
        if self.shared is not None:
            shared = self.shared(x, act)
            if self.shared_gate is not None:
                shared = sigmoid(self.shared_gate(x), self.rowwise) * shared
            y = y + shared
        return y if self.tp is None else self.tp.all_reduce(y.contiguous())
