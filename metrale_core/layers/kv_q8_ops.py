"""The q8_0 KV cache's kernels as ``CustomOp``s: quantize-on-write, decode and prefill attention
reading the int8 codes and their float16 scales directly.

Owner: ``metrale_core.layers``; :class:`Q8Ops` is built once per codec
(:class:`~metrale_core.layers.kv_q8_codec.Q8KVCodec`).

Invariants:
- q8_0 is llama.cpp's (``-ctk q8_0 -ctv q8_0``): per 32 consecutive values of a head vector one
  scale ``d = max|x| / 127`` stored as float16, and 32 codes ``round(x / d)`` (half to even, as
  ggml's x86 path) made with the float32 ``d``.  A value reads back as ``code * d16``, exact in
  float32.
- ``forward_native`` is the torch oracle (:func:`quantize_q8_0` / :func:`dequantize_q8_0`, then
  ``attention.py``'s maths); ``forward_cpu`` calls ``kernels/cpu/kv_q8.c`` (write) and the
  ``_q8`` entry points of ``attention_decode.c`` / ``attention_prefill.c``, which read the codes
  and scales inside the dot products: their output has the bits of the plain float32 kernels
  over the dequantized cache (same fixed chunks and merge order, so batch invariance holds).
- Caches: codes int8 ``[blocks, bs, Hk, d]``, scales float16 ``[blocks, bs, Hk, d // 32]``; the
  attention ops take a layer's four as one ``storage`` tuple (:data:`Q8Storage`).
- ``window`` / ``sinks`` / ``softcap`` (``window_attention``'s) run in both C kernels, which read
  no position before a row's window; ``cpu_takes`` says where they run (the codec routes windowed
  layers only there).
"""

from __future__ import annotations

import torch

from metrale_core.kernels import CustomOp
from metrale_core.layers import attention
from metrale_core.layers.op_support import KERNEL_PACKAGE, all_f32, cpu_call, dense_heads
from metrale_core.model_api.kv import gather_blocks

__all__ = [
    "Q8KVCacheWrite",
    "Q8Ops",
    "Q8PagedAttentionDecode",
    "Q8PagedAttentionPrefill",
    "Q8Storage",
    "dequantize_q8_0",
    "gather_q8_0",
    "quantize_q8_0",
]

#: Values per scale.
GROUP = 32

#: A layer's q8_0 cache: K codes, K scales, V codes, V scales (the module docstring's shapes).
Q8Storage = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def quantize_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[..., d]`` (d a multiple of 32) -> int8 codes ``[..., d]`` and float16 scales
    ``[..., d // 32]`` (the module docstring's rule)."""
    groups = x.float().reshape(*x.shape[:-1], -1, GROUP)
    d = groups.abs().amax(dim=-1, keepdim=True) / 127.0
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    codes = torch.round(groups * inv).to(torch.int8)
    return codes.reshape(x.shape), d.squeeze(-1).to(torch.float16)


def dequantize_q8_0(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``codes`` ``[..., d]`` times their ``scales`` ``[..., d // 32]`` in ``dtype``."""
    groups = codes.float().reshape(*codes.shape[:-1], -1, GROUP) * scales.float().unsqueeze(-1)
    return groups.reshape(codes.shape).to(dtype)


def gather_q8_0(codes: torch.Tensor, scales: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The dequantized ``[..., nb * bs, H, d]`` rows of ``block_ids`` ``[..., nb]``."""
    return dequantize_q8_0(
        gather_blocks(codes, block_ids, torch.int8), gather_blocks(scales, block_ids, torch.float16), dtype
    )


def _store(codes: torch.Tensor, scales: torch.Tensor, slot_mapping: torch.Tensor, x: torch.Tensor) -> None:
    q, s = quantize_q8_0(x)
    codes.view(-1, *codes.shape[2:]).index_copy_(0, slot_mapping, q)
    scales.view(-1, *scales.shape[2:]).index_copy_(0, slot_mapping, s)


def _pointers(*tensors: torch.Tensor) -> list[int]:
    return [t.data_ptr() for t in tensors]


def _cpu_takes(q: torch.Tensor, storage: Q8Storage) -> bool:
    """float32 query rows ``[.., Hq, d]`` over contiguous q8_0 caches the C kernels take (K and V
    of one shape, whole KV-head groups)."""
    d = q.shape[-1]
    return (
        all_f32(q)
        and d % GROUP == 0
        and d <= 256
        and all(c.is_contiguous() for c in storage)
        and storage[2].shape == storage[0].shape
        and q.shape[-2] % storage[0].shape[2] == 0
    )


class Q8KVCacheWrite(CustomOp):
    """Quantize ``k``/``v`` ``[T, Hk, d]`` into codes and scales at ``slot_mapping`` ``[T]``."""

    kernel_package = KERNEL_PACKAGE
    cpu_kernels = True

    def forward_native(self, k, v, k_codes, k_scales, v_codes, v_scales, slot_mapping) -> None:
        _store(k_codes, k_scales, slot_mapping, k)
        _store(v_codes, v_scales, slot_mapping, v)

    def forward_cpu(self, k, v, k_codes, k_scales, v_codes, v_scales, slot_mapping) -> None:
        args = (k, v, k_codes, k_scales, v_codes, v_scales, slot_mapping)
        if (
            not all_f32(k, v)
            or not dense_heads(k, v)
            or not all(c.is_contiguous() for c in args[2:6])
            or slot_mapping.dtype != torch.int64
            or not slot_mapping.is_contiguous()
        ):
            return self.forward_native(*args)
        cpu_call(
            self,
            "q8_kv_write",
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            k_codes.data_ptr(),
            k_scales.data_ptr(),
            v_codes.data_ptr(),
            v_scales.data_ptr(),
            slot_mapping.data_ptr(),
            k.shape[0],
            k.shape[1] * k.shape[2],
            v.shape[1] * v.shape[2],
        )
        return None


class Q8PagedAttentionDecode(CustomOp):
    """One query row per sequence over its q8_0 paged cache ``storage`` (``Q8Storage``); returns
    ``[B, Hq, d]`` (``window`` / ``sinks`` / ``softcap``: ``PagedAttentionDecode``'s)."""

    kernel_package = KERNEL_PACKAGE
    cpu_kernels = True

    def forward_native(
        self, q, storage, block_tables, context_lens, scale, max_context, window=None, sinks=None, softcap=None
    ) -> torch.Tensor:
        k_codes, k_scales, v_codes, v_scales = storage
        num_blocks = -(-max_context // k_codes.shape[1])
        tables = block_tables[:, :num_blocks]
        k = gather_q8_0(k_codes, k_scales, tables, torch.float32)
        v = gather_q8_0(v_codes, v_scales, tables, torch.float32)
        return attention.attend_decode(q, k, v, context_lens, scale, window, sinks, softcap)

    def cpu_takes(self, q, storage: Q8Storage, block_tables, context_lens) -> bool:
        """Whether the C kernel takes these inputs (``forward_cpu`` routes the others to
        ``forward_native``; ``windowed_paged_attention`` keeps its own torch path for them)."""
        return (
            self.path == "cpu"
            and _cpu_takes(q, storage)
            and dense_heads(q)
            and block_tables.dtype == torch.int64
            and context_lens.dtype == torch.int64
            and block_tables.stride(-1) == 1
            and context_lens.is_contiguous()
        )

    def forward_cpu(
        self, q, storage, block_tables, context_lens, scale, max_context, window=None, sinks=None, softcap=None
    ) -> torch.Tensor:
        if not self.cpu_takes(q, storage, block_tables, context_lens):
            args = (q, storage, block_tables, context_lens, scale, max_context, window, sinks, softcap)
            return self.forward_native(*args)
        bsz, hq, d = q.shape
        sinks = None if sinks is None else sinks.to(torch.float32).contiguous()
        out = torch.empty(bsz, hq, d, dtype=torch.float32)
        cpu_call(
            self,
            "dop_paged_decode_q8",
            out.data_ptr(),
            q.data_ptr(),
            q.stride(0),
            *_pointers(*storage, block_tables),
            block_tables.stride(0),
            context_lens.data_ptr(),
            bsz,
            hq,
            storage[0].shape[2],
            d,
            storage[0].shape[1],
            scale,
            window or 0,
            None if sinks is None else sinks.data_ptr(),
            softcap or 0.0,
            torch.get_num_threads(),
        )
        return out


class Q8PagedAttentionPrefill(CustomOp):
    """The multi-row segments of a batch over a q8_0 paged cache ``storage``, written into ``out``
    (``PagedAttentionPrefill``'s contract: ``segments`` is ``AttentionPlan.multi_row``; ``window``
    / ``softcap`` / ``sinks`` as there)."""

    kernel_package = KERNEL_PACKAGE
    cpu_kernels = True
    #: ``(segments, segments tensor)`` of the last call (one table per forward, reused by every layer).
    _segments: tuple[tuple, torch.Tensor] | None = None

    def forward_native(self, out, q, storage, block_tables, segments, scale, window=None, softcap=None, sinks=None):
        k_codes, k_scales, v_codes, v_scales = storage
        for start, end, seq, context_len in segments:
            num_blocks = -(-context_len // k_codes.shape[1])
            table = block_tables[seq, :num_blocks]
            k = gather_q8_0(k_codes, k_scales, table, q.dtype)
            v = gather_q8_0(v_codes, v_scales, table, q.dtype)
            out[start:end] = attention.attend_prefill(q[start:end], k, v, context_len, scale, window, softcap, sinks)

    def cpu_takes(self, out, q, storage: Q8Storage, block_tables) -> bool:
        """Whether the C kernel takes these inputs (``forward_cpu`` routes the others to
        ``forward_native``; ``windowed_paged_attention`` keeps its own torch path for them)."""
        return (
            self.path == "cpu"
            and _cpu_takes(q, storage)
            and all_f32(out)
            and dense_heads(q, out)
            and block_tables.dtype == torch.int64
            and block_tables.stride(-1) == 1
        )

    def forward_cpu(self, out, q, storage, block_tables, segments, scale, window=None, softcap=None, sinks=None):
        if not segments or not self.cpu_takes(out, q, storage, block_tables) or (window is not None and window < 1):
            return self.forward_native(out, q, storage, block_tables, segments, scale, window, softcap, sinks)
        sinks = None if sinks is None else sinks.to(torch.float32).contiguous()
        if self._segments is None or self._segments[0] is not segments:
            self._segments = (segments, torch.tensor(segments, dtype=torch.int64).reshape(-1, 4))
        table = self._segments[1]
        cpu_call(
            self,
            "ap_paged_prefill_q8",
            out.data_ptr(),
            out.stride(0),
            q.data_ptr(),
            q.stride(0),
            *_pointers(*storage, block_tables),
            block_tables.stride(0),
            table.data_ptr(),
            table.shape[0],
            q.shape[1],
            storage[0].shape[2],
            q.shape[2],
            storage[0].shape[1],
            window or 0,
            scale,
            softcap or 0.0,
            None if sinks is None else sinks.data_ptr(),
            torch.get_num_threads(),
        )
        return None


class Q8Ops:
    """The three q8_0 KV ops, built once for one device (so each path is chosen once)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.write = Q8KVCacheWrite(device)
        self.decode = Q8PagedAttentionDecode(device)
        self.prefill = Q8PagedAttentionPrefill(device)
