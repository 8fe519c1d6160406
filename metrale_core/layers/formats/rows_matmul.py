"""``RowsMatmul``: ``x @ w.T`` for a small dense ``w``, each row's result independent of the others.

Owner: ``metrale_core.layers.blocks.moe.RowwiseLinear`` (an MoE router, a shared expert's gate: the F32
matrices llama.cpp keeps beside the GGUF blocks).  ``F.linear`` of a whole batch is not
batch-invariant (its order of sums follows the row count), so the torch path multiplies one row at
a time; the C kernel (``dop_rows_matmul`` in ``kernels/cpu/decoder_ops.c``) does every row in one
call with a fixed order of sums per output.

Invariants:
- Either path gives a row the same bits alone and in any batch (the torch path: one ``[1, K]``
  product per row; the C path: one fixed-order dot product per output).  The two paths agree to
  float32 rounding, not bit for bit; one model uses one path for its whole life (chosen once).
- The C path takes float32 rows with unit stride along ``K`` and a dense float32 ``w``; anything
  else runs the torch path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from metrale_core.kernels import CustomOp, KernelInputError

__all__ = ["RowsMatmul", "rows_matmul"]

_OPS: dict[str, RowsMatmul] = {}


class RowsMatmul(CustomOp):
    """``x [T, K] @ w [N, K].T -> [T, N]`` row by row (module docstring)."""

    kernel_package = "metrale_core.layers"
    cpu_kernels = True

    def forward_native(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        rows = [F.linear(row, w) for row in x.unbind(0)]
        return torch.stack(rows) if rows else x.new_zeros(0, w.shape[0])

    def forward_cpu(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype is not torch.float32 or w.dtype is not torch.float32 or x.dim() != 2 or x.stride(-1) != 1:
            return self.forward_native(x, w)
        w = w.contiguous()
        rows, k = x.shape
        out = torch.empty(rows, w.shape[0], dtype=torch.float32)
        if rows:
            status = self.cpu_kernel.dop_rows_matmul(
                x.data_ptr(), x.stride(0), w.data_ptr(), out.data_ptr(), rows, w.shape[0], k, torch.get_num_threads()
            )
            if status != 0:
                raise KernelInputError(f"{self.name}: dop_rows_matmul rejected its arguments")
        return out


def rows_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """:class:`RowsMatmul` on ``w``'s device (the op is built once per device)."""
    key = str(w.device)
    op = _OPS.get(key)
    if op is None:
        op = _OPS[key] = RowsMatmul(w.device)
    return op(x, w)
