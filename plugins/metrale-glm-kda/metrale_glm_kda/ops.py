"""The hot ops of GLM-5.3 as ``CustomOp``s: a torch oracle plus a CuPy kernel each.

Owner: ``metrale_glm_kda``; :class:`GlmOps` builds all of them once per model.

Ops and kernels:
- ``KdaDecodeStep`` (``kernels/kda_decode.cu``): one token per sequence, L2-norm of q/k, the
  delta-rule update of the float32 state *in place in the pool* at the sequences' slots, output.
- ``ShortConvUpdate`` (``kernels/short_conv.cu``): one token per sequence through the depthwise
  causal conv + SiLU, shifting the slot's conv state in place.
- ``MoeRouting`` (``kernels/moe_routing.cu``): sigmoid scores, biased top-k, renormalised and
  scaled weights, one block per row (``n_group == 1``; grouped layouts use the torch path).
- ``HcSinkhorn`` (``kernels/hc_sinkhorn.cu``): the mHC Sinkhorn normalisation in place, one
  thread per row (``hc <= 8``), instead of ~6 launches per iteration.
- The chunked prefill (``kda.kda_chunked``) has no custom kernel: it is documented torch
  (per-chunk einsum + a unit-lower triangular solve + matmuls), which runs on any device.

Invariants:
- ``forward_native`` delegates to ``kda.py`` / ``moe.py``; ``forward_cuda`` checks its inputs
  and launches ``<name>_f32`` or ``<name>_bf16`` (activation dtype; state is always float32);
  other dtypes and unsupported shapes route to ``forward_native``.
- Both paths update the state pool in place and return the same values.
"""

from __future__ import annotations

import torch

from metrale_core.api import CustomOp, check_tensor, f32, i32, ptr, torch_stream
from metrale_glm_kda import hc, kda, moe

__all__ = ["GlmOps", "HcSinkhorn", "KdaDecodeStep", "MoeRouting", "ShortConvUpdate"]

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


class KdaDecodeStep(CustomOp):
    """``(q, k [B, H, K], v [B, H, V], g [B, H, K] f32, beta [B, H] f32, pool [S, H, K, V] f32,
    slots [B] int64) -> o [B, H, V] float32``; q/k are raw (normalised inside)."""

    kernel_package = "metrale_glm_kda"
    kernel_file = "kda_decode.cu"

    def forward_native(self, q, k, v, g, beta, pool, slots):
        qn, kn = kda.prepare_qk(q, k)
        out, state = kda.kda_recurrent(qn[None], kn[None], v[None], g[None], beta[None], pool[slots])
        pool[slots] = state
        return out[0]

    def forward_cuda(self, q, k, v, g, beta, pool, slots):
        bsz, heads, dk = q.shape
        dv = v.shape[-1]
        if q.dtype not in _SUFFIX or dk > 256 or dv > 1024 or bsz == 0:
            return self.forward_native(q, k, v, g, beta, pool, slots)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        g, beta = g.float().contiguous(), beta.float().contiguous()
        for name, t, shape in (("k", k, (bsz, heads, dk)), ("v", v, (bsz, heads, dv))):
            check_tensor(self.name, name, t, dtypes=(q.dtype,), shape=shape)
        check_tensor(self.name, "g", g, dtypes=(torch.float32,), shape=(bsz, heads, dk))
        check_tensor(self.name, "beta", beta, dtypes=(torch.float32,), shape=(bsz, heads))
        check_tensor(self.name, "pool", pool, dtypes=(torch.float32,), shape=(-1, heads, dk, dv))
        check_tensor(self.name, "slots", slots, dtypes=(torch.int64,), shape=(bsz,))
        out = torch.empty((bsz, heads, dv), dtype=torch.float32, device=q.device)
        threads = max(32, (dv + 31) // 32 * 32)
        with torch_stream(q.device):
            self.kernel(f"kda_decode_{_SUFFIX[q.dtype]}")(
                (heads, bsz),
                (threads,),
                (
                    ptr(q),
                    ptr(k),
                    ptr(v),
                    ptr(g),
                    ptr(beta),
                    ptr(pool),
                    ptr(slots),
                    ptr(out),
                    i32(heads),
                    i32(dk),
                    i32(dv),
                ),
            )
        return out


class ShortConvUpdate(CustomOp):
    """``(x [B, C], pool [S, C, W-1], weight [C, W] f32, slots [B] int64) -> y [B, C]``."""

    kernel_package = "metrale_glm_kda"
    kernel_file = "short_conv.cu"

    def forward_native(self, x, pool, weight, slots):
        y, state = kda.conv_decode(x, pool[slots], weight)
        pool[slots] = state
        return y

    def forward_cuda(self, x, pool, weight, slots):
        bsz, channels = x.shape
        width = weight.shape[-1]
        if x.dtype not in _SUFFIX or pool.dtype != x.dtype or width > 8 or bsz == 0:
            return self.forward_native(x, pool, weight, slots)
        x = x.contiguous()
        check_tensor(self.name, "pool", pool, dtypes=(x.dtype,), shape=(-1, channels, width - 1))
        check_tensor(self.name, "weight", weight, dtypes=(torch.float32,), shape=(channels, width))
        check_tensor(self.name, "slots", slots, dtypes=(torch.int64,), shape=(bsz,))
        y = torch.empty_like(x)
        with torch_stream(x.device):
            self.kernel(f"short_conv_update_{_SUFFIX[x.dtype]}")(
                ((channels + 255) // 256, bsz),
                (256,),
                (ptr(x), ptr(pool), ptr(weight), ptr(slots), ptr(y), i32(channels), i32(width)),
            )
        return y


class MoeRouting(CustomOp):
    """``(logits [T, E] f32, bias [E] f32) -> (weights [T, k] f32, experts [T, k] int64)``."""

    kernel_package = "metrale_glm_kda"
    kernel_file = "moe_routing.cu"

    def __init__(
        self, device, *, top_k: int, n_group: int, topk_group: int, norm_topk_prob: bool, scaling: float
    ) -> None:
        super().__init__(device)
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.norm_topk_prob, self.scaling = norm_topk_prob, scaling

    def forward_native(self, logits, bias):
        return moe.route(logits, bias, self.top_k, self.n_group, self.topk_group, self.norm_topk_prob, self.scaling)

    def forward_cuda(self, logits, bias):
        rows, experts = logits.shape
        if self.n_group != 1 or experts > 1024 or self.top_k > 32 or rows == 0:
            return self.forward_native(logits, bias)
        logits = logits.float().contiguous()
        check_tensor(self.name, "bias", bias, dtypes=(torch.float32,), shape=(experts,))
        weights = torch.empty((rows, self.top_k), dtype=torch.float32, device=logits.device)
        index = torch.empty((rows, self.top_k), dtype=torch.int64, device=logits.device)
        threads = max(32, min(1024, (experts + 31) // 32 * 32))
        with torch_stream(logits.device):
            self.kernel("moe_routing_f32")(
                (rows,),
                (threads,),
                (
                    ptr(logits),
                    ptr(bias),
                    ptr(weights),
                    ptr(index),
                    i32(experts),
                    i32(self.top_k),
                    i32(int(self.norm_topk_prob)),
                    f32(self.scaling),
                ),
            )
        return weights, index


class HcSinkhorn(CustomOp):
    """``(comb [T, hc, hc] f32, iters, eps) -> comb`` normalised in place (see ``hc.sinkhorn_``)."""

    kernel_package = "metrale_glm_kda"
    kernel_file = "hc_sinkhorn.cu"

    def forward_native(self, comb, iters, eps):
        return hc.sinkhorn_(comb, iters, eps)

    def forward_cuda(self, comb, iters, eps):
        rows, width, _ = comb.shape
        if comb.dtype != torch.float32 or width > 8 or rows == 0 or not comb.is_contiguous():
            return self.forward_native(comb, iters, eps)
        check_tensor(self.name, "comb", comb, dtypes=(torch.float32,), shape=(rows, width, width))
        with torch_stream(comb.device):
            self.kernel("hc_sinkhorn_f32")(
                ((rows + 127) // 128,), (128,), (ptr(comb), i32(rows), i32(width), i32(iters), f32(eps))
            )
        return comb


class GlmOps:
    """Every op the model uses, built once for one device (so the path is chosen once)."""

    def __init__(
        self,
        device: torch.device | str,
        *,
        top_k: int,
        n_group: int,
        topk_group: int,
        norm_topk_prob: bool,
        scaling: float,
    ) -> None:
        self.kda_decode = KdaDecodeStep(device)
        self.conv_update = ShortConvUpdate(device)
        self.route = MoeRouting(
            device, top_k=top_k, n_group=n_group, topk_group=topk_group, norm_topk_prob=norm_topk_prob, scaling=scaling
        )
        self.sinkhorn = HcSinkhorn(device)

    def __repr__(self) -> str:
        return f"GlmOps({self.kda_decode!r}, {self.conv_update!r}, {self.route!r}, {self.sinkhorn!r})"
