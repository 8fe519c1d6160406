"""Feed-forward blocks of GLM-5.3: the clamped SwiGLU MLP and the sigmoid-routed MoE.

Owner: ``metrale_glm_kda``.  :func:`route` is the torch oracle of ``kernels/moe_routing.cu``: the
core's DeepSeek-V3 routing (``metrale_core.api.route``) with GLM's arguments.

Invariants:
- SwiGLU clamp (``swiglu_limit``): ``gate <= limit``, ``-limit <= up <= limit`` before
  ``silu(gate) * up``, in the dense MLP, the shared expert and every routed expert.
- Routing is batched over all rows: float32 logits, sigmoid scores, top-k chosen on
  ``scores + e_score_correction_bias`` within the best ``topk_group`` groups (group score = sum of
  its top 2), weights = the *unbiased* scores of the chosen experts, renormalised when
  ``norm_topk_prob``, times ``routed_scaling_factor`` (the core's ``route``).
- Experts run as one matmul pair per *active* expert over its (token, slot) pairs, gathered
  once in expert order (no loop over tokens, one scatter back, a sum over the k slots), or, when
  the whole routed work is small (``DENSE_LIMIT``), densely: every expert on every row, weighted
  by the routing weights (zero where not chosen); the shared expert is added after the routed sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attrs import frozen

from metrale_core.api import Groups, Linear
from metrale_core.api import route as core_route

__all__ = ["DENSE_LIMIT", "MlpWeights", "MoeWeights", "mlp_forward", "moe_forward", "route", "swiglu_clamped"]


@frozen
class MlpWeights:
    """A SwiGLU MLP with fused ``gate_up`` ``[2I, D]`` and ``down`` ``[D, I]`` (shared linear layers,
    so in the loader's weight format)."""

    gate_up: Linear
    down: Linear


@frozen
class MoeWeights:
    """Router (float32 ``[E, D]`` + bias ``[E]``), stacked experts and the shared expert."""

    router: torch.Tensor
    bias: torch.Tensor
    #: ``[E, 2I, D]`` and ``[E, D, I]``.
    gate_up: torch.Tensor
    down: torch.Tensor
    shared: MlpWeights


def swiglu_clamped(gate_up: torch.Tensor, limit: float | None) -> torch.Tensor:
    """``silu(min(gate, limit)) * clamp(up, -limit, limit)`` of a fused ``[.., 2I]`` projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


def mlp_forward(x: torch.Tensor, w: MlpWeights, limit: float | None) -> torch.Tensor:
    return w.down(swiglu_clamped(w.gate_up(x), limit))


def route(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [T, k] float32, experts [T, k] int64)`` from router logits ``[T, E]`` (float32)."""
    groups = Groups(n_group, topk_group, "top2") if n_group > 1 else None
    return core_route(logits, top_k, "sigmoid", norm_topk_prob, bias, groups=groups, scale=scaling)


#: Routed work (rows x experts x 3 x I x D multiply-adds) up to which every expert runs on every
#: row in three batched ops (zero weight where not chosen): for small experts (decode on small
#: models) the per-expert loop's op overhead costs more than the wasted arithmetic.
DENSE_LIMIT = 1 << 20


def _dense_experts(
    x: torch.Tensor, w: MoeWeights, limit: float | None, weights: torch.Tensor, experts: torch.Tensor
) -> torch.Tensor:
    rows = x.shape[0]
    num, two_i, dim = w.gate_up.shape
    act = swiglu_clamped(F.linear(x, w.gate_up.reshape(num * two_i, dim)).view(rows, num, two_i), limit)
    y = torch.einsum("rei,edi->red", act, w.down)  # [rows, E, D]
    gate = torch.zeros(rows, num, dtype=torch.float32, device=x.device).scatter_(1, experts, weights.float())
    return torch.einsum("re,red->rd", gate.to(y.dtype), y).to(x.dtype)


def moe_forward(x: torch.Tensor, w: MoeWeights, limit: float | None, router_op) -> torch.Tensor:
    """Routed experts plus the shared expert for rows ``x`` ``[T, D]``.

    ``router_op(logits, bias) -> (weights, experts)`` is the routing op (kernel or :func:`route`).
    """
    logits = F.linear(x.float(), w.router)
    weights, experts = router_op(logits, w.bias)
    if x.shape[0] * w.gate_up.numel() * 3 // 2 <= DENSE_LIMIT:
        return _dense_experts(x, w, limit, weights, experts) + mlp_forward(x, w.shared, limit)
    rows, top_k = experts.shape
    flat = experts.reshape(-1)
    order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=w.gate_up.shape[0]).tolist()
    xs = x[order // top_k]
    ys, start = [], 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        act = swiglu_clamped(F.linear(xs[start : start + count], w.gate_up[expert]), limit)
        ys.append(F.linear(act, w.down[expert]))
        start += count
    pairs = torch.empty(rows * top_k, x.shape[-1], dtype=x.dtype, device=x.device)
    pairs[order] = (torch.cat(ys) * weights.reshape(-1)[order].unsqueeze(-1)).to(x.dtype)
    return pairs.view(rows, top_k, -1).sum(dim=1) + mlp_forward(x, w.shared, limit)
