"""Layer ops that have only their torch path so far: GeGLU and the token embedding.

Owner: ``metrale_core.layers``.  Each is a :class:`~metrale_core.kernels.CustomOp` whose
``forward_native`` is the oracle (``functional.geglu``, ``F.embedding``), so a model plugin calls
them like the kernel-backed ops of ``norm_ops.py`` and a kernel can be added later without touching it.

Invariants: no kernel package, so the path is always ``native`` (``METRALE_KERNELS=cuda|cpu``
forcing a kernel is a ``ConfigError``, as for every op without one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from metrale_core.kernels import CustomOp
from metrale_core.layers.pointwise import functional

__all__ = ["Embedding", "GeGLU"]


class GeGLU(CustomOp):
    """``gelu_tanh(gate) * up`` on the fused ``[T, 2I]`` gate/up projection; returns ``[T, I]``."""

    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        return functional.geglu(gate_up)


class Embedding(CustomOp):
    """Token ids ``[T]`` -> rows ``[T, D]`` of ``weight`` ``[V, D]`` (the output head is a
    ``linear.build_linear(..., output_head=True)`` projection, tied or not)."""

    def forward_native(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, weight)
