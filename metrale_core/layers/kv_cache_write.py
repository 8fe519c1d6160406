"""Writing a step's K/V rows into the paged cache as a ``CustomOp``: a torch oracle
(``attention.write_kv``), a CuPy kernel and a C CPU kernel.

Owner: ``metrale_core.layers``; :class:`~metrale_core.layers.decoder_ops.DecoderOps` builds it.

Invariants:
- Rows go to ``slot_mapping``'s slots and nowhere else; the op works in place and returns None.
- The C path takes float32 rows with dense heads into float32 or bfloat16 caches; everything else
  takes ``forward_native``.  The kernel runs on torch's current CUDA stream.
"""

from __future__ import annotations

import torch

from metrale_core.kernels import CustomOp, check_tensor
from metrale_core.kernels.cuda import i32, i64, ptr, torch_stream
from metrale_core.layers import attention
from metrale_core.layers.op_support import (
    KERNEL_PACKAGE,
    SUFFIX,
    all_f32,
    check_heads,
    cpu_caches,
    cpu_call,
    dense_heads,
)

__all__ = ["KVCacheWrite"]


class KVCacheWrite(CustomOp):
    """Write ``k``/``v`` ``[T, Hk, d]`` into ``k_cache``/``v_cache`` at ``slot_mapping`` ``[T]``."""

    kernel_package = KERNEL_PACKAGE
    kernel_file = "kv_cache_write.cu"
    cpu_kernels = True

    def forward_native(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        attention.write_kv(k, v, k_cache, v_cache, slot_mapping)

    def forward_cpu(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        row = k.shape[1] * k.shape[2]
        bf16 = k_cache.dtype == torch.bfloat16
        if (
            not all_f32(k, v)
            or not dense_heads(k, v)
            or not cpu_caches(k_cache, v_cache)
            or k_cache.shape[2:] != k.shape[1:]
            or (bf16 and row % 16)
            or slot_mapping.dtype != torch.int64
            or not slot_mapping.is_contiguous()
        ):
            return self.forward_native(k, v, k_cache, v_cache, slot_mapping)
        cpu_call(
            self,
            "dop_kv_write",
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            slot_mapping.data_ptr(),
            k.shape[0],
            row,
            bf16,
        )
        return None

    def forward_cuda(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        if k_cache.dtype not in SUFFIX or k.dtype != k_cache.dtype:
            return self.forward_native(k, v, k_cache, v_cache, slot_mapping)
        num_tokens, hk, d = k.shape
        check_heads(self.name, "k", k, hk, d)
        check_heads(self.name, "v", v, hk, d)
        check_tensor(self.name, "k_cache", k_cache, dtypes=(k.dtype,), shape=(-1, -1, hk, d))
        check_tensor(self.name, "v_cache", v_cache, dtypes=(k.dtype,), shape=tuple(k_cache.shape))
        check_tensor(self.name, "slot_mapping", slot_mapping, dtypes=(torch.int64,), shape=(num_tokens,))
        if num_tokens:
            with torch_stream(k.device):
                self.kernel(f"kv_cache_write_{SUFFIX[k.dtype]}")(
                    (num_tokens,),
                    (128,),
                    (
                        ptr(k),
                        ptr(v),
                        ptr(k_cache),
                        ptr(v_cache),
                        ptr(slot_mapping),
                        i32(num_tokens),
                        i32(hk * d),
                        i64(k.stride(0)),
                        i64(v.stride(0)),
                    ),
                )
        return None
