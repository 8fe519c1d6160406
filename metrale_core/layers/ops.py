"""The paged-attention ops of the decoder as ``CustomOp``s: a torch oracle, a CuPy kernel and a C
CPU kernel each.

Owner: ``metrale_core.layers``; :class:`~metrale_core.layers.decoder_ops.DecoderOps` builds them
once per model (with the per-token ops of :mod:`metrale_core.layers.pointwise.norm_ops` and
:mod:`metrale_core.layers.kv_cache_write`); what they share is in :mod:`metrale_core.layers.op_support`.

Invariants:
- ``forward_native`` delegates to ``attention.py`` (the oracles); ``forward_cuda``
  checks its inputs and launches the matching ``kernels/*.cu`` entry point (``<name>_f32`` or
  ``<name>_bf16``); dtypes without a kernel (float16) route to ``forward_native``.
- ``forward_cpu`` calls the C entry point of its op, declared in the ``.h`` beside it (the one
  statement of its signature): ``dop_*`` of ``kernels/cpu/decoder_ops.c``, decode attention
  ``dop_paged_decode`` of ``attention_decode.c``, prefill attention ``ap_paged_prefill`` of
  ``attention_prefill.c``, for float32
  activations with dense rows (KV caches: float32 or bfloat16) and routes everything else (other
  dtypes, strided heads, head sizes the kernel does not take) to ``forward_native``.
- All kernels run on torch's current CUDA stream.
"""

from __future__ import annotations

import torch

from metrale_core.kernels import CustomOp, KernelInputError
from metrale_core.kernels.checks import check_paged_kv
from metrale_core.kernels.paged_decode import launch_paged_decode
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

    ``max_context`` is the host-side maximum of ``context_lens`` (saves a device sync).  The CPU
    kernel (``kernels/cpu/attention_decode.c``) splits each context into fixed chunks of positions
    that run in parallel and merges them in chunk order: batch-invariant at any thread count.
    """

    kernel_package = KERNEL_PACKAGE
    kernel_file = "paged_attention_decode.cu"
    cpu_kernels = True

    def forward_native(
        self,
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale: float,
        max_context: int,
        window=None,
        sinks=None,
        softcap=None,
    ) -> torch.Tensor:
        return attention.decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale, max_context, window, sinks, softcap
        )

    def cpu_takes(self, q, k_cache, v_cache, block_tables, context_lens) -> bool:
        """Whether the C kernel takes these inputs (``forward_cpu`` routes the others to
        ``forward_native``; ``windowed_paged_attention`` keeps its own torch path for them)."""
        hq, d, hk = q.shape[1], q.shape[2], k_cache.shape[2]
        return (
            self.path == "cpu"
            and _f32(q)
            and d % 16 == 0
            and d <= 256
            and hq % hk == 0
            and _dense_heads(q)
            and _cpu_caches(k_cache, v_cache)
            and block_tables.dtype == torch.int64
            and context_lens.dtype == torch.int64
            and block_tables.stride(-1) == 1
            and context_lens.is_contiguous()
        )

    def forward_cpu(
        self,
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale: float,
        max_context: int,
        window=None,
        sinks=None,
        softcap=None,
    ) -> torch.Tensor:
        """``window`` (None: unbounded), ``sinks`` ``[Hq]`` (None: none) and ``softcap`` (None: not
        capped) as in ``window_attention``: the C kernel reads only the positions a row's window
        holds."""
        if not self.cpu_takes(q, k_cache, v_cache, block_tables, context_lens):
            args = (q, k_cache, v_cache, block_tables, context_lens, scale, max_context, window, sinks, softcap)
            return self.forward_native(*args)
        bsz, hq, d = q.shape
        sinks = None if sinks is None else sinks.to(torch.float32).contiguous()
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
            k_cache.shape[2],
            d,
            k_cache.shape[1],
            scale,
            window or 0,
            None if sinks is None else sinks.data_ptr(),
            softcap or 0.0,
            torch.get_num_threads(),
        )
        return out

    def forward_cuda(
        self,
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        scale: float,
        max_context: int,
        window=None,
        sinks=None,
        softcap=None,
    ) -> torch.Tensor:
        bsz, hq, d = q.shape
        plain = not window and sinks is None and softcap is None
        if q.dtype not in _SUFFIX or k_cache.dtype != q.dtype or d > 256 or bsz == 0 or not plain:
            args = (q, k_cache, v_cache, block_tables, context_lens, scale, max_context, window, sinks, softcap)
            return self.forward_native(*args)
        hk = k_cache.shape[2]
        if hq % hk:
            raise KernelInputError(f"{self.name}: {hq} query heads are not a multiple of {hk} KV heads")
        q = q.contiguous()
        check_paged_kv(
            self.name, k_cache, v_cache, block_tables, context_lens, dtype=q.dtype, rows=bsz, heads=hk, head_dim=d
        )
        function = f"paged_attention_decode_{_SUFFIX[q.dtype]}"
        return launch_paged_decode(self, function, q, k_cache, v_cache, block_tables, context_lens, scale)


class PagedAttentionPrefill(CustomOp):
    """The multi-row segments of a batch (prefill chunks, verify rows) attending causally over a
    plain paged cache, written into ``out`` ``[T, Hq, d]``: ``segments`` holds ``(row_start,
    row_end, sequence, context_len)`` per segment (``AttentionPlan.multi_row``); ``window``: a row
    sees only the last ``window`` positions up to its own (None: all of them); ``softcap`` /
    ``sinks``: ``window_attention``'s soft-capping and sink logits.

    CPU only (there is no CUDA kernel: CUDA models attend prefill rows through ``attention.py``).
    The C kernel (``kernels/cpu/attention_prefill.c``) attends every segment of a step in one
    call, tiled with an online softmax (no score matrix over the context), each row the same bits
    whatever the rest of the step; ``attention.prefill_attention`` is its oracle."""

    kernel_package = KERNEL_PACKAGE
    cpu_kernels = True
    #: ``(segments, segments tensor)`` of the last call (one table per forward, reused by every layer).
    _segments: tuple[tuple, torch.Tensor] | None = None

    def forward_native(
        self,
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        segments,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        for start, end, seq, context_len in segments:
            out[start:end] = attention.prefill_attention(
                q[start:end], k_cache, v_cache, block_tables[seq], context_len, scale, window, softcap, sinks
            )

    def forward_cpu(
        self,
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        segments,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        d, hq, hk = q.shape[2], q.shape[1], k_cache.shape[2]
        if (
            not segments
            or not _f32(q, out)
            or d % 16
            or d > 256
            or hq % hk
            or not _dense_heads(q, out)
            or not _cpu_caches(k_cache, v_cache)
            or block_tables.dtype != torch.int64
            or block_tables.stride(-1) != 1
            or (window is not None and window < 1)
        ):
            return self.forward_native(out, q, k_cache, v_cache, block_tables, segments, scale, window, softcap, sinks)
        sinks = None if sinks is None else sinks.to(torch.float32).contiguous()
        if self._segments is None or self._segments[0] is not segments:
            self._segments = (segments, torch.tensor(segments, dtype=torch.int64).reshape(-1, 4))
        table = self._segments[1]
        _cpu_call(
            self,
            "ap_paged_prefill",
            out.data_ptr(),
            out.stride(0),
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.dtype == torch.bfloat16,
            block_tables.data_ptr(),
            block_tables.stride(0),
            table.data_ptr(),
            table.shape[0],
            hq,
            hk,
            d,
            k_cache.shape[1],
            0 if window is None else window,
            scale,
            softcap or 0.0,
            None if sinks is None else sinks.data_ptr(),
            torch.get_num_threads(),
        )
        return None
