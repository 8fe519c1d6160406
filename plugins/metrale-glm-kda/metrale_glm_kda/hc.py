"""mHC (manifold-constrained hyper-connections): the ``hc_mult`` residual streams of GLM-5.3.

Owner: ``metrale_glm_kda``; the model calls :func:`hc_collapse` before and :func:`hc_expand` after
each attention / MLP sublayer, exactly as transformers' ``Glm5NextTextHyperConnection``.

Invariants:
- Streams are ``[T, hc, D]`` per row; everything is per row (no cross-row mixing).
- The weight maths (norm, projection, sigmoids, softmax, Sinkhorn) runs in float32; the
  collapsed sublayer input and the expanded streams are in the streams' dtype.
- ``comb`` is made doubly stochastic by ``hc_sinkhorn_iters`` Sinkhorn steps (column first) by
  :func:`sinkhorn_` or the op passed as ``sinkhorn`` (``ops.HcSinkhorn``: one kernel on CUDA).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attrs import frozen

__all__ = ["HcWeights", "hc_collapse", "hc_expand", "sinkhorn_"]


@frozen
class HcWeights:
    """One hyper-connection: ``fn`` ``[(2+hc)*hc, hc*D]``, ``base`` ``[(2+hc)*hc]``, ``scale`` ``[3]`` (float32)."""

    fn: torch.Tensor
    base: torch.Tensor
    scale: torch.Tensor


def sinkhorn_(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Normalise ``comb`` ``[T, hc, hc]`` in place: columns, then ``iters - 1`` x (rows, columns),
    each ``x / (sum + eps)``; returns it."""
    comb.div_(comb.sum(dim=-2, keepdim=True).add_(eps))
    for _ in range(iters - 1):
        comb.div_(comb.sum(dim=-1, keepdim=True).add_(eps))
        comb.div_(comb.sum(dim=-2, keepdim=True).add_(eps))
    return comb


def hc_collapse(
    streams: torch.Tensor, w: HcWeights, eps: float, hc_eps: float, iters: int, sinkhorn=sinkhorn_
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(post [T, hc], comb [T, hc, hc], collapsed [T, D])`` of ``streams`` ``[T, hc, D]``;
    ``sinkhorn(comb, iters, eps)`` normalises in place."""
    rows, hc, _ = streams.shape
    flat = streams.reshape(rows, -1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)
    mixed = F.linear(flat, w.fn)
    pre_w, post_w, comb_w = mixed.split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = w.base.split([hc, hc, hc * hc])
    pre = torch.sigmoid(pre_w * w.scale[0] + pre_b) + hc_eps
    post = 2 * torch.sigmoid(post_w * w.scale[1] + post_b)
    comb = torch.softmax(comb_w.view(rows, hc, hc) * w.scale[2] + comb_b.view(hc, hc), dim=-1) + hc_eps
    comb = sinkhorn(comb, iters, hc_eps)
    collapsed = (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
    return post, comb, collapsed


def hc_expand(y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``X'[h'] = post[h'] * y + sum_h comb[h, h'] * X[h]`` -> ``[T, hc, D]``."""
    dtype = residual.dtype
    return post.to(dtype).unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), residual)
