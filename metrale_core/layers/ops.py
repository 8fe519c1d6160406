"""The paged-attention ops of the decoder as ``CustomOp``s: a torch oracle, a CuPy kernel and a C
CPU kernel each.

Owner: ``metrale_core.layers``; :class:`~metrale_core.layers.decoder_ops.DecoderOps` builds them
once per model (with the per-token ops of :mod:`metrale_core.layers.pointwise.norm_ops` and
:mod:`metrale_core.layers.kv_cache_write`); what they share is in :mod:`metrale_core.layers.op_support`.

Invariants:
- ``forward_native`` delegates to ``attention.py`` (the oracles); ``forward_cuda``
  checks its inputs and launches the matching ``kernels/*.cu`` entry point (``<name>_f32`` or
  ``<name>_bf16``); dtypes without a kernel (float16) route to ``forward_native``.
- ``forward_cpu`` calls the ``dop_*`` entry point of ``kernels/cpu/decoder_ops.c`` (declared in
  ``decoder_ops.h``, the one statement of its signature) for float32
  activations with dense rows (KV caches: float32 or bfloat16) and routes everything else (other
  dtypes, strided heads, head sizes the kernel does not take) to ``forward_native``.
- All kernels run on torch's current CUDA stream.
"""

from __future__ import annotations

import torch

from metrale_core.kernels import CustomOp, KernelInputError, check_tensor
from metrale_core.kernels.cuda import f32, i32, ptr, torch_stream
from metrale_core.layers import attention
from metrale_core.layers.op_support import KERNEL_PACKAGE
from metrale_core.layers.op_support import SUFFIX as _SUFFIX
from metrale_core.layers.op_support import all_f32 as _f32
from metrale_core.layers.op_support import cpu_caches as _cpu_caches
from metrale_core.layers.op_support import cpu_call as _cpu_call
from metrale_core.layers.op_support import dense_heads as _dense_heads

__all__ = ["PagedAttentionDecode", "PagedAttentionPrefill"]


class PagedAttentionDecode(CustomOp):
    """One query row per sequence attending over its paged cache; returns ``[B, Hq, d]``.

    ``max_context`` is the host-side maximum of ``context_lens`` (saves a device sync).
    """

    kernel_package = KERNEL_PACKAGE
    kernel_file = "paged_attention_decode.cu"
    cpu_kernels = True

    def forward_native(
        self, q, k_cache, v_cache, block_tables, context_lens, scale: float, max_context: int
    ) -> torch.Tensor:
        return attention.decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, max_context)

    def forward_cpu(
        self, q, k_cache, v_cache, block_tables, context_lens, scale: float, max_context: int
    ) -> torch.Tensor:
        bsz, hq, d = q.shape
        hk = k_cache.shape[2]
        if (
            not _f32(q)
            or d % 16
            or d > 256
            or hq % hk
            or not _dense_heads(q)
            or not _cpu_caches(k_cache, v_cache)
            or block_tables.dtype != torch.int64
            or context_lens.dtype != torch.int64
            or block_tables.stride(-1) != 1
            or not context_lens.is_contiguous()
        ):
            return self.forward_native(q, k_cache, v_cache, block_tables, context_lens, scale, max_context)
        out = torch.empty(bsz, hq, d, dtype=torch.float32)
        _cpu_call(
            self,
            "dop_paged_decode",
            out.data_ptr(),
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.dtype == torch.bfloat16,
            block_tables.data_ptr(),
            block_tables.stride(0),
            context_lens.data_ptr(),
            bsz,
            hq,
            hk,
            d,
            k_cache.shape[1],
            scale,
            torch.get_num_threads(),
        )
        return out

    def forward_cuda(
        self, q, k_cache, v_cache, block_tables, context_lens, scale: float, max_context: int
    ) -> torch.Tensor:
        bsz, hq, d = q.shape
        if q.dtype not in _SUFFIX or k_cache.dtype != q.dtype or d > 256 or bsz == 0:
            return self.forward_native(q, k_cache, v_cache, block_tables, context_lens, scale, max_context)
        hk = k_cache.shape[2]
        if hq % hk:
            raise KernelInputError(f"{self.name}: {hq} query heads are not a multiple of {hk} KV heads")
        q = q.contiguous()
        check_tensor(self.name, "k_cache", k_cache, dtypes=(q.dtype,), shape=(-1, -1, hk, d))
        check_tensor(self.name, "v_cache", v_cache, dtypes=(q.dtype,), shape=tuple(k_cache.shape))
        check_tensor(self.name, "block_tables", block_tables, dtypes=(torch.int64,), shape=(bsz, -1))
        check_tensor(self.name, "context_lens", context_lens, dtypes=(torch.int64,), shape=(bsz,))
        out = torch.empty_like(q)
        with torch_stream(q.device):
            self.kernel(f"paged_attention_decode_{_SUFFIX[q.dtype]}")(
                (hq, bsz),
                (128,),
                (
                    ptr(out),
                    ptr(q),
                    ptr(k_cache),
                    ptr(v_cache),
                    ptr(block_tables),
                    ptr(context_lens),
                    f32(scale),
                    i32(hq),
                    i32(hk),
                    i32(d),
                    i32(k_cache.shape[1]),
                    i32(block_tables.shape[1]),
                ),
            )
        return out


class PagedAttentionPrefill(CustomOp):
    """The multi-row segments of a batch (prefill chunks) attending causally over a plain paged
    cache, written into ``out`` ``[T, Hq, d]``: ``segments`` holds ``(row_start, row_end,
    sequence, context_len)`` per segment (``AttentionPlan.multi_row``).

    CPU only (there is no CUDA kernel: CUDA models attend prefill rows through ``attention.py``).
    The C kernel takes segments of up to ``C_KERNEL_ROWS`` rows -- many short prompts in one
    call, where SDPA per segment cost ~90 us per sequence and layer; longer ones go through SDPA,
    which is as fast from ~512 rows (SmolLM2, 2 threads)."""

    kernel_package = KERNEL_PACKAGE
    cpu_kernels = True
    #: Longest segment the C kernel attends (longer: SDPA per segment).
    C_KERNEL_ROWS = 256
    #: ``(segments, rows tensor)`` of the last call (one table per forward, reused by every layer).
    _rows: tuple[tuple, torch.Tensor] | None = None

    def forward_native(self, out, q, k_cache, v_cache, block_tables, segments, scale: float) -> None:
        for start, end, seq, context_len in segments:
            out[start:end] = attention.prefill_attention(
                q[start:end], k_cache, v_cache, block_tables[seq], context_len, scale
            )

    def forward_cpu(self, out, q, k_cache, v_cache, block_tables, segments, scale: float) -> None:
        d, hq, hk = q.shape[2], q.shape[1], k_cache.shape[2]
        short = tuple(s for s in segments if s[1] - s[0] <= self.C_KERNEL_ROWS)
        if (
            not short
            or not _f32(q, out)
            or d % 16
            or d > 256
            or hq % hk
            or not _dense_heads(q, out)
            or not _cpu_caches(k_cache, v_cache)
            or block_tables.dtype != torch.int64
            or block_tables.stride(-1) != 1
        ):
            return self.forward_native(out, q, k_cache, v_cache, block_tables, segments, scale)
        if self._rows is None or self._rows[0] is not segments:
            table = [
                (start + i, seq, context_len - (end - start) + i + 1)
                for start, end, seq, context_len in short
                for i in range(end - start)
            ]
            self._rows = (segments, torch.tensor(table, dtype=torch.int64))
        rows = self._rows[1]
        _cpu_call(
            self,
            "dop_paged_prefill",
            out.data_ptr(),
            out.stride(0),
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.dtype == torch.bfloat16,
            block_tables.data_ptr(),
            block_tables.stride(0),
            rows.data_ptr(),
            rows.shape[0],
            hq,
            hk,
            d,
            k_cache.shape[1],
            scale,
            torch.get_num_threads(),
        )
        if len(short) < len(segments):
            self.forward_native(
                out,
                q,
                k_cache,
                v_cache,
                block_tables,
                tuple(s for s in segments if s[1] - s[0] > self.C_KERNEL_ROWS),
                scale,
            )
        return None
