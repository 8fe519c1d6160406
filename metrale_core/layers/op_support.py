"""What the decoder's ``CustomOp``s share: their kernel package, the CUDA launch constants, the
C-library call and the input predicates that pick the C path.

Owner: ``metrale_core.layers``; used by :mod:`metrale_core.layers.ops` (paged attention),
:mod:`metrale_core.layers.pointwise.norm_ops` and :mod:`metrale_core.layers.kv_cache_write`.

Invariants:
- The predicates only inspect dtypes, shapes and strides (no copies, no device syncs): they run a
  few hundred times per step.
- :func:`cpu_call` raises on a -1 from the C library: the predicates route every input the C
  kernels do not take to ``forward_native`` first, so a -1 is a caller bug.
"""

from __future__ import annotations

from typing import Any

import torch

from metrale_core.kernels import CustomOp, KernelInputError, check_shape

__all__ = [
    "KERNEL_PACKAGE",
    "SUFFIX",
    "THREADS",
    "adjacent_heads",
    "all_f32",
    "check_heads",
    "cpu_caches",
    "cpu_call",
    "dense_heads",
    "round_up_32",
]

#: The package whose ``kernels/`` (``.cu``) and ``kernels/cpu/`` (``.c``) hold these ops' sources.
KERNEL_PACKAGE = "metrale_core.layers"
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
THREADS = 256


def cpu_call(op: CustomOp, name: str, *args: Any) -> None:
    """Run entry point ``name`` of ``op``'s C library (its signature comes from
    ``kernels/cpu/decoder_ops.h``, bound when the library loads); a -1 is a caller bug."""
    if getattr(op.cpu_kernel, name)(*args) != 0:
        raise KernelInputError(f"{op.name}: {name} rejected its arguments")


def all_f32(*tensors: torch.Tensor | None) -> bool:
    for t in tensors:  # noqa: SIM110 -- a loop, not all(<generator>): this runs a few hundred times per step
        if t is not None and t.dtype is not torch.float32:
            return False
    return True


def cpu_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Plain ``[blocks, bs, Hk, d]`` caches the C kernels read: float32 or bfloat16, contiguous."""
    return (
        k_cache.dtype in (torch.float32, torch.bfloat16)
        and v_cache.dtype == k_cache.dtype
        and v_cache.shape == k_cache.shape
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    )


def round_up_32(n: int) -> int:
    return max(32, (n + 31) // 32 * 32)


def dense_heads(*tensors: torch.Tensor) -> bool:
    """Every ``[T, H, d]`` tensor has dense heads (``d`` contiguous floats each, heads adjacent;
    tokens may be strided)."""
    return all(t.dim() == 3 and t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] for t in tensors)


def check_heads(op: str, name: str, t: torch.Tensor, heads: int, head_dim: int) -> None:
    """``t`` is ``[T, heads, head_dim]`` with dense heads (tokens may be strided)."""
    check_shape(op, name, t, (-1, heads, head_dim))
    if not dense_heads(t):
        raise KernelInputError(f"{op}: {name} needs dense [heads, head_dim] rows, got strides {t.stride()}")


def adjacent_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
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
