"""The FP8 KV kernels as ``CustomOp``s: quantize-on-write and the dequantizing decode attention.

Owner: ``metrale_fp8``; :class:`Fp8Ops` builds both once per codec.

Invariants:
- ``forward_native`` is the torch oracle (``e4m3.quantize`` / ``e4m3.dequantize``); ``forward_cuda``
  launches ``kernels/fp8_kv_write.cu`` / ``kernels/fp8_paged_attention_decode.cu``
  (``_f32`` / ``_bf16``); other dtypes route to ``forward_native``.
- Caches are ``float8_e4m3fn`` ``[blocks, bs, Hk, d]``; scales are float32 ``[Hk]`` tensors on the
  cache's device (a per-tensor scale is repeated per head).
"""

from __future__ import annotations

import torch

from metrale_core.api import (
    CustomOp,
    check_paged_kv,
    check_tensor,
    gather_blocks,
    i32,
    i64,
    launch_paged_decode,
    ptr,
    torch_stream,
)
from metrale_fp8.e4m3 import FP8_DTYPE, dequantize, quantize

__all__ = ["Fp8KVCacheWrite", "Fp8Ops", "Fp8PagedAttentionDecode", "store_codes"]

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def store_codes(cache: torch.Tensor, slot_mapping: torch.Tensor, x: torch.Tensor, scale: torch.Tensor) -> None:
    """Quantize ``x`` ``[T, Hk, d]`` with ``scale`` into ``cache`` at flat slots ``[T]``."""
    flat = cache.view(torch.uint8).view(-1, *cache.shape[2:])
    flat.index_copy_(0, slot_mapping, quantize(x, scale).view(torch.uint8))


def _dense_heads(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, H, d]`` with dense ``[H, d]`` rows (tokens may stay strided)."""
    return x if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] else x.contiguous()


class Fp8KVCacheWrite(CustomOp):
    """Quantize ``k``/``v`` ``[T, Hk, d]`` into E4M3 caches at ``slot_mapping`` ``[T]``."""

    kernel_package = "metrale_fp8"
    kernel_file = "fp8_kv_write.cu"

    def forward_native(self, k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
        store_codes(k_cache, slot_mapping, k, k_scale)
        store_codes(v_cache, slot_mapping, v, v_scale)

    def forward_cuda(self, k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
        if k.dtype not in _SUFFIX or v.dtype != k.dtype:
            return self.forward_native(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
        num_tokens, hk, dk = k.shape
        dv = v.shape[2]
        k, v = _dense_heads(k), _dense_heads(v)
        check_tensor(self.name, "k_cache", k_cache, dtypes=(FP8_DTYPE,), shape=(-1, -1, hk, dk))
        check_tensor(self.name, "v_cache", v_cache, dtypes=(FP8_DTYPE,), shape=(-1, -1, hk, dv))
        check_tensor(self.name, "k_scale", k_scale, dtypes=(torch.float32,), shape=(hk,))
        check_tensor(self.name, "v_scale", v_scale, dtypes=(torch.float32,), shape=(hk,))
        check_tensor(self.name, "slot_mapping", slot_mapping, dtypes=(torch.int64,), shape=(num_tokens,))
        if num_tokens:
            with torch_stream(k.device):
                self.kernel(f"fp8_kv_write_{_SUFFIX[k.dtype]}")(
                    (num_tokens,),
                    (128,),
                    (
                        ptr(k),
                        ptr(v),
                        ptr(k_cache),
                        ptr(v_cache),
                        ptr(slot_mapping),
                        ptr(k_scale),
                        ptr(v_scale),
                        i32(num_tokens),
                        i32(hk),
                        i32(dk),
                        i32(dv),
                        i64(k.stride(0)),
                        i64(v.stride(0)),
                    ),
                )
        return None


class Fp8PagedAttentionDecode(CustomOp):
    """One query row per sequence over its E4M3 paged cache; returns ``[B, Hq, d]``."""

    kernel_package = "metrale_fp8"
    kernel_file = "fp8_paged_attention_decode.cu"

    def forward_native(
        self, q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, scale: float, max_context: int
    ) -> torch.Tensor:
        bsz, hq, d = q.shape
        hk = k_cache.shape[2]
        num_blocks = -(-max_context // k_cache.shape[1])
        tables = block_tables[:, :num_blocks]
        k = dequantize(gather_blocks(k_cache, tables, FP8_DTYPE), k_scale, torch.float32)
        v = dequantize(gather_blocks(v_cache, tables, FP8_DTYPE), v_scale, torch.float32)
        scores = torch.einsum("bhgd,blhd->bhgl", q.float().view(bsz, hk, hq // hk, d), k) * scale
        pad = torch.arange(k.shape[1], device=q.device)[None, :] >= context_lens[:, None]
        probs = torch.softmax(scores.masked_fill(pad[:, None, None, :], float("-inf")), dim=-1)
        return torch.einsum("bhgl,blhd->bhgd", probs, v).reshape(bsz, hq, d).to(q.dtype)

    def forward_cuda(
        self, q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, scale: float, max_context: int
    ) -> torch.Tensor:
        bsz, hq, d = q.shape
        hk = k_cache.shape[2]
        args = (q, k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, scale, max_context)
        if q.dtype not in _SUFFIX or d > 256 or bsz == 0 or v_cache.shape[3] != d or hq % hk:
            return self.forward_native(*args)
        q = q.contiguous()
        check_paged_kv(
            self.name, k_cache, v_cache, block_tables, context_lens, dtype=FP8_DTYPE, rows=bsz, heads=hk, head_dim=d
        )
        function = f"fp8_paged_attention_decode_{_SUFFIX[q.dtype]}"
        scales = (k_scale, v_scale)
        return launch_paged_decode(self, function, q, k_cache, v_cache, block_tables, context_lens, scale, scales)


class Fp8Ops:
    """Both FP8 KV ops, built once for one device (so the path is chosen once)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.write = Fp8KVCacheWrite(device)
        self.decode = Fp8PagedAttentionDecode(device)

    @property
    def fused(self) -> bool:
        """The CUDA kernels run here (on CPU the model gathers and attends itself)."""
        return self.decode.path == "cuda"
