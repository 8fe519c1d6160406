"""The launch of a paged decode-attention CUDA kernel, for every kernel of the core's decode ABI.

Owner: ``metrale_core.kernels``; called by the ``forward_cuda`` of the core's
``PagedAttentionDecode`` and of kernel plugins' variants (fp8's ``Fp8PagedAttentionDecode``),
after their input checks (:func:`~metrale_core.kernels.checks.check_paged_kv`).

Invariants: the ABI is one block of 128 threads per (query head, sequence) and the arguments
``out, q, k_cache, v_cache, *scales, block_tables, context_lens, scale, Hq, Hk, d, block_size,
max_blocks``; ``out`` is a new tensor like ``q``; the launch runs on torch's current stream of
``q``'s device.  Importing this module imports neither CuPy nor NumPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from metrale_core.kernels.cuda import f32, i32, ptr, torch_stream

__all__ = ["launch_paged_decode"]


def launch_paged_decode(
    op: Any,
    function: str,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    scales: Sequence[torch.Tensor] = (),
) -> torch.Tensor:
    """Run ``op.kernel(function)`` over ``q`` ``[B, Hq, d]`` and its paged cache ``[blocks,
    block_size, Hk, d]``; ``scales`` (e.g. per-head K and V scales) go after ``v_cache``."""
    bsz, hq, d = q.shape
    out = torch.empty_like(q)
    with torch_stream(q.device):
        op.kernel(function)(
            (hq, bsz),
            (128,),
            (
                ptr(out),
                ptr(q),
                ptr(k_cache),
                ptr(v_cache),
                *(ptr(t) for t in scales),
                ptr(block_tables),
                ptr(context_lens),
                f32(scale),
                i32(hq),
                i32(k_cache.shape[2]),
                i32(d),
                i32(k_cache.shape[1]),
                i32(block_tables.shape[1]),
            ),
        )
    return out
