"""DeepSeek's multi-head latent attention (MLA) over the paged KV cache, absorbed form.

Owner: ``metrale_core.layers``; the decoder definition builds one :class:`MlaWeights` per layer
of an ``Attention(kind="mla")`` family (``metrale_core.decoder.mla``) and calls
:func:`mla_attention`.

The layer, per row ``x`` (``H`` heads, latent rank ``R``, ``n`` / ``r`` / ``v`` the no-rope,
rope and value head dims)::

    q          = q_proj(x)  or  q_b(rms(q_a(x)))                   [H, n + r]
    c, k_pe    = kv_a(x) split [R, r];  c = rms(c)                  (one latent, one rope key)
    q_pe, k_pe = rope_interleaved(q_pe), rope_interleaved(k_pe)     (adjacent pairs rotate)
    q_lat[h]   = W_uk[h]^T q_nope[h]                                [H, R]   (W_uk = kv_b's key half)
    o_lat      = attention([q_lat; q_pe] over keys [c; k_pe], values [c; k_pe])[:, :, :R]
    out        = concat_h W_uv[h] o_lat[h]     [H v]  (W_uv = kv_b's value half; o_proj is the caller's)

which is transformers' ``q_nope . (W_uk c) + q_pe . k_pe`` with values ``W_uv c``, the products
reassociated.

Cache: one KV head of ``R + r`` per token (``KVLayout(num_kv_heads=1, head_dim=R + r)``); K holds
``[c; k_pe]`` and V the same row, so the ordinary paged attention (every kernel, every KV codec,
FP8 included) runs it as MQA, and the value's last ``r`` outputs are dropped.  Cost: ``2 (R + r)``
values per token and layer -- the latent twice -- against ``H (n + r + v)`` for K/V expanded per
head (DeepSeek-V2-Lite: 1152 against 5120, 4.4x smaller); a latent-only layout would halve it.

Invariants:
- Every row's ``[c; k_pe]`` is written at ``slot_mapping`` (through ``kv.write``) before any row
  attends; softmax runs in float32 (``paged_attention``); the softmax scale is the plan's.
- RoPE rotates adjacent pairs (DeepSeek's complex form, llama.cpp's NORM rope on these archs) of
  the rope dims only, with the tables' first ``r / 2`` frequencies (``[T, r]`` tables, halves equal).
- ``rowwise``: a row's per-head absorptions do not depend on the batch around it (the
  batch-invariant formats): the C kernel (``kernels/cpu/mla_absorb.c``, float32, all rows in one
  call, each row's sums in a fixed order) where it runs, else torch one row at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from attrs import frozen

from metrale_core.kernels.custom_op import cpu_layer_library
from metrale_core.layers.attention import AttentionPlan, paged_attention
from metrale_core.layers.formats.cpu_qmatmul import PACKAGE  # the C library of metrale_core.layers
from metrale_core.layers.formats.linear import Linear
from metrale_core.model_api import ForwardBatch, PagedKVCache

__all__ = ["MlaShape", "MlaWeights", "mla_attention", "mla_kernel", "rope_interleaved"]

Norm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@frozen
class MlaShape:
    """Dimensions of one MLA layer."""

    heads: int
    #: ``kv_lora_rank`` (R).
    latent: int
    #: ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``.
    nope: int
    rope: int
    value: int


@frozen
class MlaWeights:
    """One layer's projections; q is ``q`` alone or the low-rank pair ``q_a`` / ``q_b``."""

    q: Linear | None  # [H (n + r), D]
    q_a: Linear | None  # [Rq, D]
    q_a_norm: torch.Tensor | None  # [Rq]
    q_b: Linear | None  # [H (n + r), Rq]
    kv_a: Linear  # [R + r, D]
    kv_a_norm: torch.Tensor  # [R]
    w_uk: torch.Tensor  # [H, n, R]
    w_uv: torch.Tensor  # [H, v, R]


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs ``(x[2j], x[2j+1])`` of ``x`` ``[T, h, d]`` by frequency ``j`` of the
    ``[T, d]`` tables (their first half)."""
    half = x.shape[-1] // 2
    c, s = cos[:, None, :half], sin[:, None, :half]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def mla_kernel() -> Any:
    """The package's C library when the CPU path is chosen for the absorptions, else None."""
    return cpu_layer_library("MlaAbsorb", PACKAGE)


#: The per-head products: ``x`` ``[T, H, K]`` times ``w_uk`` ``[H, K, N]`` / ``w_uv`` ``[H, N, K]``.
_UK, _UV = "thn,hnr->thr", "thr,hvr->thv"


def _per_head(x: torch.Tensor, w: torch.Tensor, equation: str, rowwise: bool) -> torch.Tensor:
    """``einsum(equation, x, w)`` (:data:`_UK` or :data:`_UV`); ``rowwise``: batch-invariant, on
    the C kernel where it runs, else torch one row at a time."""
    if not rowwise:
        return torch.einsum(equation, x, w)
    lib = mla_kernel() if x.dtype == w.dtype == torch.float32 and x.device.type == "cpu" else None
    if lib is None or x.stride(-1) != 1 or not w.is_contiguous():
        parts = [torch.einsum(equation, row, w) for row in x.split(1)]
        return torch.cat(parts) if len(parts) > 1 else torch.einsum(equation, x, w)
    if equation == _UV:  # w_uv [H, N, K] -> [H, K, N]: the kernel's one form (4 MB for V2-Lite)
        w = w.transpose(1, 2).contiguous()
    rows, heads, k = x.shape
    n = int(w.shape[2])
    out = torch.empty(rows, heads, n, dtype=torch.float32)
    args = (x.data_ptr(), x.stride(0), x.stride(1), w.data_ptr(), out.data_ptr())
    if lib.mt_head_matmul(*args, rows, heads, k, n, torch.get_num_threads()) != 0:
        raise ValueError(f"mt_head_matmul cannot take x {list(x.shape)} with w {list(w.shape)}")
    return out


def mla_attention(
    x: torch.Tensor,
    w: MlaWeights,
    shape: MlaShape,
    kv: PagedKVCache,
    layer: int,
    batch: ForwardBatch,
    plan: AttentionPlan,
    ops: object,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: Norm,
    *,
    rowwise: bool = False,
) -> torch.Tensor:
    """Layer ``layer``'s attention of the rows ``x`` ``[T, D]`` -> ``[T, H v]``, before ``o_proj``;
    ``ops`` is the model's ``DecoderOps``, ``norm(x, weight)`` its RMSNorm."""
    rows, s = x.shape[0], shape
    if w.q is not None:
        q = w.q(x)
    else:
        assert w.q_a is not None and w.q_b is not None and w.q_a_norm is not None
        q = w.q_b(norm(w.q_a(x), w.q_a_norm))
    q_nope, q_pe = q.view(rows, s.heads, s.nope + s.rope).split([s.nope, s.rope], dim=-1)
    c, k_pe = w.kv_a(x).split([s.latent, s.rope], dim=-1)
    c = norm(c.contiguous(), w.kv_a_norm)
    q_pe = rope_interleaved(q_pe, cos, sin)
    k_pe = rope_interleaved(k_pe.reshape(rows, 1, s.rope), cos, sin)
    q_lat = _per_head(q_nope, w.w_uk, _UK, rowwise)
    key = torch.cat((c.view(rows, 1, s.latent), k_pe), dim=-1)
    kv.write(layer, batch.slot_mapping, key, key, kernel=ops.kv_write)  # type: ignore[attr-defined]
    query = torch.cat((q_lat, q_pe), dim=-1).contiguous()
    out = paged_attention(query, kv, layer, plan, ops.decode_attention, ops.prefill_attention)  # type: ignore[attr-defined]
    o = _per_head(out[..., : s.latent], w.w_uv, _UV, rowwise)
    return o.reshape(rows, s.heads * s.value)
