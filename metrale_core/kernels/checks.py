"""Input checks every ``forward_cuda`` runs before a launch.

Owner: ``metrale_core.kernels``; called by :class:`~metrale_core.kernels.CustomOp` subclasses.

Invariants:
- A check either returns ``None`` or raises :class:`KernelInputError` naming the op, the argument
  and what was expected, so a wrong launch never reaches the device.
- ``-1`` in an expected shape matches any size; ``None`` matches any shape of that rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from metrale_core.errors import MetraleError

__all__ = [
    "KernelInputError",
    "check_contiguous",
    "check_dtype",
    "check_paged_kv",
    "check_same_device",
    "check_shape",
    "check_tensor",
]


class KernelInputError(MetraleError, ValueError):
    """A kernel was handed a tensor of the wrong dtype, layout, shape or device."""


def check_dtype(op: str, name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """Raise unless ``t.dtype`` is one of ``allowed``."""
    if t.dtype not in tuple(allowed):
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise KernelInputError(f"{op}: {name} has dtype {t.dtype}, expected one of: {names}")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    """Raise unless ``t`` is C-contiguous (the kernels index with dense row-major strides)."""
    if not t.is_contiguous():
        raise KernelInputError(
            f"{op}: {name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()}); call .contiguous() first"
        )


def check_shape(op: str, name: str, t: torch.Tensor, expected: Sequence[int]) -> None:
    """Raise unless ``t.shape`` matches ``expected`` (``-1`` = any size in that dimension)."""
    shape = tuple(t.shape)
    ok = len(shape) == len(expected) and all(e == -1 or e == s for s, e in zip(shape, expected))
    if not ok:
        want = "[" + ", ".join("*" if e == -1 else str(e) for e in expected) + "]"
        raise KernelInputError(f"{op}: {name} has shape {list(shape)}, expected {want}")


def check_same_device(op: str, device: torch.device, **tensors: torch.Tensor) -> None:
    """Raise unless every tensor lives on ``device``."""
    for name, t in tensors.items():
        if t.device != device:
            raise KernelInputError(f"{op}: {name} is on {t.device}, expected {device}")


def check_tensor(
    op: str,
    name: str,
    t: torch.Tensor,
    *,
    dtypes: Sequence[torch.dtype],
    shape: Sequence[int] | None = None,
    contiguous: bool = True,
) -> None:
    """The usual trio in one call: dtype, then shape, then contiguity."""
    check_dtype(op, name, t, dtypes)
    if shape is not None:
        check_shape(op, name, t, shape)
    if contiguous:
        check_contiguous(op, name, t)


def check_paged_kv(
    op: str,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    dtype: torch.dtype,
    rows: int,
    heads: int,
    head_dim: int,
) -> None:
    """The paged cache of a decode-attention launch: ``k_cache`` ``[blocks, block_size, heads,
    head_dim]`` of ``dtype``, ``v_cache`` of K's shape and dtype, ``block_tables`` ``[rows, *]``
    and ``context_lens`` ``[rows]`` of int64, all contiguous; checked in that order."""
    check_tensor(op, "k_cache", k_cache, dtypes=(dtype,), shape=(-1, -1, heads, head_dim))
    check_tensor(op, "v_cache", v_cache, dtypes=(dtype,), shape=tuple(k_cache.shape))
    check_tensor(op, "block_tables", block_tables, dtypes=(torch.int64,), shape=(rows, -1))
    check_tensor(op, "context_lens", context_lens, dtypes=(torch.int64,), shape=(rows,))
