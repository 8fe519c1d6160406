"""The hot ops of the decoder as ``CustomOp``s: a torch oracle, a CuPy kernel and a C CPU kernel each.

Owner: ``metrale_core.layers``; :class:`DecoderOps` builds all of them once per model (every
decoder plugin: Qwen3 / Llama / Qwen2 today).

Invariants:
- ``forward_native`` delegates to ``functional.py`` / ``attention.py`` (the oracles); ``forward_cuda``
  checks its inputs and launches the matching ``kernels/*.cu`` entry point (``<name>_f32`` or
  ``<name>_bf16``); dtypes without a kernel (float16) route to ``forward_native``.
- ``forward_cpu`` calls the C entry point of its op, declared in the ``.h`` beside it (the one
  statement of its signature): ``dop_*`` of ``kernels/cpu/decoder_ops.c``, decode attention
  ``dop_paged_decode`` of ``attention_decode.c``, prefill attention ``ap_paged_prefill`` of
  ``attention_prefill.c``, for float32
  activations with dense rows (KV caches: float32 or bfloat16) and routes everything else (other
  dtypes, strided heads, head sizes the kernel does not take) to ``forward_native``.
- ``QKNormRope`` and ``KVCacheWrite`` may work in place: callers use the returned tensors.
- All kernels run on torch's current CUDA stream.
"""

from __future__ import annotations

from typing import Any

import torch

from metrale_core.kernels import CustomOp, KernelInputError, check_dtype, check_shape, check_tensor
from metrale_core.kernels.cuda import f32, i32, i64, ptr, torch_stream
from metrale_core.layers import attention
from metrale_core.layers import functional as layers

__all__ = [
    "DecoderOps",
    "KVCacheWrite",
    "PagedAttentionDecode",
    "PagedAttentionPrefill",
    "QKNormRope",
    "RMSNorm",
    "SwiGLU",
]

#: The package whose ``kernels/`` (``.cu``) and ``kernels/cpu/`` (``.c``) hold these ops' sources.
KERNEL_PACKAGE = "metrale_core.layers"
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_THREADS = 256


def _cpu_call(op: CustomOp, name: str, *args: Any) -> None:
    """Run entry point ``name`` of ``op``'s C library (its signature comes from
    ``kernels/cpu/decoder_ops.h``, bound when the library loads); a -1 is a caller bug."""
    if getattr(op.cpu_kernel, name)(*args) != 0:
        raise KernelInputError(f"{op.name}: {name} rejected its arguments")


def _f32(*tensors: torch.Tensor | None) -> bool:
    for t in tensors:  # noqa: SIM110 -- a loop, not all(<generator>): this runs a few hundred times per step
        if t is not None and t.dtype is not torch.float32:
            return False
    return True


def _cpu_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Plain ``[blocks, bs, Hk, d]`` caches the C kernels read: float32 or bfloat16, contiguous."""
    return (
        k_cache.dtype in (torch.float32, torch.bfloat16)
        and v_cache.dtype == k_cache.dtype
        and v_cache.shape == k_cache.shape
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    )


def _round_up_32(n: int) -> int:
    return max(32, (n + 31) // 32 * 32)


def _dense_heads(*tensors: torch.Tensor) -> bool:
    """Every ``[T, H, d]`` tensor has dense heads (``d`` contiguous floats each, heads adjacent;
    tokens may be strided)."""
    return all(t.dim() == 3 and t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] for t in tensors)


def _check_heads(op: str, name: str, t: torch.Tensor, heads: int, head_dim: int) -> None:
    """``t`` is ``[T, heads, head_dim]`` with dense heads (tokens may be strided)."""
    check_shape(op, name, t, (-1, heads, head_dim))
    if not _dense_heads(t):
        raise KernelInputError(f"{op}: {name} needs dense [heads, head_dim] rows, got strides {t.stride()}")


def _adjacent_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """``[T, Hq + Hk, d]`` view over ``q`` and ``k`` when ``k``'s heads directly follow ``q``'s in
    memory (the split of a fused qkv projection), else None."""
    if (
        q.dtype != k.dtype
        or q.stride() != k.stride()
        or q.stride(-1) != 1
        or q.stride(1) != q.shape[2]
        or q.shape[0] != k.shape[0]
        or k.data_ptr() != q.data_ptr() + q.shape[1] * q.shape[2] * q.element_size()
    ):
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())


class RMSNorm(CustomOp):
    """``rms_norm(x, weight, eps)`` over the last dimension."""

    kernel_package = KERNEL_PACKAGE
    kernel_file = "rmsnorm.cu"
    cpu_kernels = True

    def forward_cpu(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dim = x.shape[-1]
        if not _f32(x, weight) or dim == 0 or weight.shape != (dim,) or not weight.is_contiguous():
            return self.forward_native(x, weight, eps)
        rows = x if x.dim() == 2 else x.reshape(-1, dim)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty(rows.shape[0], dim, dtype=torch.float32)
        _cpu_call(
            self,
            "dop_rms_norm",
            rows.data_ptr(),
            rows.stride(0),
            weight.data_ptr(),
            out.data_ptr(),
            rows.shape[0],
            dim,
            eps,
            torch.get_num_threads(),
        )
        return out if x.dim() == 2 else out.view(x.shape)

    def forward_native(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return layers.rms_norm(x, weight, eps)

    def forward_cuda(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dtype not in _SUFFIX or x.shape[-1] == 0:
            return self.forward_native(x, weight, eps)
        dim = x.shape[-1]
        x = x.contiguous()
        check_tensor(self.name, "weight", weight, dtypes=(x.dtype,), shape=(dim,))
        out = torch.empty_like(x)
        rows = x.numel() // dim
        if rows:
            with torch_stream(x.device):
                self.kernel(f"rmsnorm_{_SUFFIX[x.dtype]}")(
                    (rows,), (_THREADS,), (ptr(x), ptr(weight), ptr(out), i32(rows), i32(dim), f32(eps))
                )
        return out


class QKNormRope(CustomOp):
    """Per-head RMSNorm of q and k (skipped when the weights are None) followed by RoPE.

    ``q`` ``[T, Hq, d]``, ``k`` ``[T, Hk, d]``, ``cos``/``sin`` ``[T, d]`` in the activation dtype.
    Returns ``(q, k)``; the CUDA path rotates the inputs in place.
    """

    kernel_package = KERNEL_PACKAGE
    kernel_file = "qk_norm_rope.cu"
    cpu_kernels = True
    #: ``(sin, signed_sin(sin))`` of the last call (the native path's per-forward memo).
    _signed: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward_native(self, q, k, q_weight, k_weight, cos, sin, eps: float):
        if q_weight is not None:
            q = layers.rms_norm(q, q_weight, eps)
            k = layers.rms_norm(k, k_weight, eps)
        qk = _adjacent_heads(q, k)
        if qk is None:
            qk = torch.cat((q, k), dim=1)
        # every layer of a forward passes the same sin table: sign it once
        if self._signed is None or self._signed[0] is not sin:
            self._signed = (sin, layers.signed_sin(sin))
        qk = layers.apply_rope(qk, cos, sin, self._signed[1])  # one rotation for all heads
        return qk[:, : q.shape[1]], qk[:, q.shape[1] :]

    def forward_cpu(self, q, k, q_weight, k_weight, cos, sin, eps: float):
        (num_tokens, hq, d), hk = q.shape, k.shape[1]
        if (
            not _f32(q, k, q_weight, k_weight, cos, sin)
            or d % 2
            or not _dense_heads(q, k)
            or cos.shape != (num_tokens, d)
            or not (cos.is_contiguous() and sin.is_contiguous())
            or (q_weight is None) != (k_weight is None)
        ):
            return self.forward_native(q, k, q_weight, k_weight, cos, sin, eps)
        qw = None if q_weight is None else q_weight.contiguous().data_ptr()
        kw = None if k_weight is None else k_weight.contiguous().data_ptr()
        _cpu_call(
            self,
            "dop_qk_norm_rope",
            q.data_ptr(),
            q.stride(0),
            hq,
            k.data_ptr(),
            k.stride(0),
            hk,
            num_tokens,
            d,
            qw,
            kw,
            cos.data_ptr(),
            sin.data_ptr(),
            eps,
            torch.get_num_threads(),
        )
        return q, k

    def forward_cuda(self, q, k, q_weight, k_weight, cos, sin, eps: float):
        num_tokens, hq, d = q.shape
        hk = k.shape[1]
        if q.dtype not in _SUFFIX or d % 2 or d > 2048 or num_tokens == 0:
            return self.forward_native(q, k, q_weight, k_weight, cos, sin, eps)
        _check_heads(self.name, "q", q, hq, d)
        _check_heads(self.name, "k", k, hk, d)
        check_dtype(self.name, "k", k, (q.dtype,))
        check_tensor(self.name, "cos", cos, dtypes=(q.dtype,), shape=(num_tokens, d))
        check_tensor(self.name, "sin", sin, dtypes=(q.dtype,), shape=(num_tokens, d))
        use_norm = q_weight is not None
        if use_norm:
            check_tensor(self.name, "q_weight", q_weight, dtypes=(q.dtype,), shape=(d,))
            check_tensor(self.name, "k_weight", k_weight, dtypes=(q.dtype,), shape=(d,))
        qw = q_weight if use_norm else cos  # any valid pointer; not read without the norm
        kw = k_weight if use_norm else cos
        with torch_stream(q.device):
            self.kernel(f"qk_norm_rope_{_SUFFIX[q.dtype]}")(
                (num_tokens, hq + hk),
                (_round_up_32(d // 2),),
                (
                    ptr(q),
                    ptr(k),
                    ptr(qw),
                    ptr(kw),
                    ptr(cos),
                    ptr(sin),
                    i32(num_tokens),
                    i32(hq),
                    i32(hk),
                    i32(d),
                    i64(q.stride(0)),
                    i64(k.stride(0)),
                    f32(eps),
                    i32(int(use_norm)),
                ),
            )
        return q, k


class SwiGLU(CustomOp):
    """``silu(gate) * up`` on the fused ``[T, 2I]`` gate/up projection; returns ``[T, I]``."""

    kernel_package = KERNEL_PACKAGE
    kernel_file = "swiglu.cu"
    cpu_kernels = True

    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        return layers.swiglu(gate_up)

    def forward_cpu(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not _f32(gate_up) or gate_up.dim() != 2 or gate_up.shape[-1] % 2 or gate_up.shape[-1] == 0:
            return self.forward_native(gate_up)
        gate_up = gate_up.contiguous()
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, inter, dtype=torch.float32)
        _cpu_call(self, "dop_swiglu", gate_up.data_ptr(), out.data_ptr(), rows, inter, torch.get_num_threads())
        return out

    def forward_cuda(self, gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.dtype not in _SUFFIX or gate_up.shape[-1] % 2:
            return self.forward_native(gate_up)
        gate_up = gate_up.contiguous()
        inter = gate_up.shape[-1] // 2
        rows = gate_up.numel() // max(1, 2 * inter)
        out = torch.empty((*gate_up.shape[:-1], inter), dtype=gate_up.dtype, device=gate_up.device)
        total = rows * inter
        if total:
            blocks = min((total + _THREADS - 1) // _THREADS, 65535)
            with torch_stream(gate_up.device):
                self.kernel(f"swiglu_{_SUFFIX[gate_up.dtype]}")(
                    (blocks,), (_THREADS,), (ptr(gate_up), ptr(out), i64(rows), i32(inter))
                )
        return out


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
            not _f32(k, v)
            or not _dense_heads(k, v)
            or not _cpu_caches(k_cache, v_cache)
            or k_cache.shape[2:] != k.shape[1:]
            or (bf16 and row % 16)
            or slot_mapping.dtype != torch.int64
            or not slot_mapping.is_contiguous()
        ):
            return self.forward_native(k, v, k_cache, v_cache, slot_mapping)
        _cpu_call(
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
        if k_cache.dtype not in _SUFFIX or k.dtype != k_cache.dtype:
            return self.forward_native(k, v, k_cache, v_cache, slot_mapping)
        num_tokens, hk, d = k.shape
        _check_heads(self.name, "k", k, hk, d)
        _check_heads(self.name, "v", v, hk, d)
        check_tensor(self.name, "k_cache", k_cache, dtypes=(k.dtype,), shape=(-1, -1, hk, d))
        check_tensor(self.name, "v_cache", v_cache, dtypes=(k.dtype,), shape=tuple(k_cache.shape))
        check_tensor(self.name, "slot_mapping", slot_mapping, dtypes=(torch.int64,), shape=(num_tokens,))
        if num_tokens:
            with torch_stream(k.device):
                self.kernel(f"kv_cache_write_{_SUFFIX[k.dtype]}")(
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
        self, q, k_cache, v_cache, block_tables, context_lens, scale: float, max_context: int, window=None, sinks=None
    ) -> torch.Tensor:
        return attention.decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale, max_context, window, sinks
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
        self, q, k_cache, v_cache, block_tables, context_lens, scale: float, max_context: int, window=None, sinks=None
    ) -> torch.Tensor:
        """``window`` (None: unbounded) and ``sinks`` ``[Hq]`` (None: none) as in
        ``window_attention``: the C kernel reads only the positions a row's window holds."""
        if not self.cpu_takes(q, k_cache, v_cache, block_tables, context_lens):
            args = (q, k_cache, v_cache, block_tables, context_lens, scale, max_context, window, sinks)
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
            torch.get_num_threads(),
        )
        return out

    def forward_cuda(
        self, q, k_cache, v_cache, block_tables, context_lens, scale: float, max_context: int, window=None, sinks=None
    ) -> torch.Tensor:
        bsz, hq, d = q.shape
        if q.dtype not in _SUFFIX or k_cache.dtype != q.dtype or d > 256 or bsz == 0 or window or sinks is not None:
            args = (q, k_cache, v_cache, block_tables, context_lens, scale, max_context, window, sinks)
            return self.forward_native(*args)
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
    """The multi-row segments of a batch (prefill chunks, verify rows) attending causally over a
    plain paged cache, written into ``out`` ``[T, Hq, d]``: ``segments`` holds ``(row_start,
    row_end, sequence, context_len)`` per segment (``AttentionPlan.multi_row``); ``window``: a row
    sees only the last ``window`` positions up to its own (None: all of them).

    CPU only (there is no CUDA kernel: CUDA models attend prefill rows through ``attention.py``).
    The C kernel (``kernels/cpu/attention_prefill.c``) attends every segment of a step in one
    call, tiled with an online softmax (no score matrix over the context), each row the same bits
    whatever the rest of the step; ``attention.prefill_attention`` is its oracle."""

    kernel_package = KERNEL_PACKAGE
    cpu_kernels = True
    #: ``(segments, segments tensor)`` of the last call (one table per forward, reused by every layer).
    _segments: tuple[tuple, torch.Tensor] | None = None

    def forward_native(
        self, out, q, k_cache, v_cache, block_tables, segments, scale: float, window: int | None = None
    ) -> None:
        for start, end, seq, context_len in segments:
            out[start:end] = attention.prefill_attention(
                q[start:end], k_cache, v_cache, block_tables[seq], context_len, scale, window
            )

    def forward_cpu(
        self, out, q, k_cache, v_cache, block_tables, segments, scale: float, window: int | None = None
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
            return self.forward_native(out, q, k_cache, v_cache, block_tables, segments, scale, window)
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
            torch.get_num_threads(),
        )
        return None


class DecoderOps:
    """Every op the decoder uses, built once for one device (so the path is chosen once).
    ``prefill_attention`` exists on CPU models only (None on CUDA)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.rms_norm = RMSNorm(device)
        self.qk_norm_rope = QKNormRope(device)
        self.swiglu = SwiGLU(device)
        self.kv_write = KVCacheWrite(device)
        self.decode_attention = PagedAttentionDecode(device)
        self.prefill_attention = PagedAttentionPrefill(device) if torch.device(device).type == "cpu" else None

    def __repr__(self) -> str:
        ops = (
            self.rms_norm,
            self.qk_norm_rope,
            self.swiglu,
            self.kv_write,
            self.decode_attention,
            self.prefill_attention,
        )
        return "DecoderOps(" + ", ".join(map(repr, filter(None, ops))) + ")"
