"""``Top2``: the two largest logits of every row (the B1 observer's one scan per step).

Owner: ``metrale_b1.b1_margin.B1MarginObserver`` builds one per device and calls it on the
``[N, V]`` float32 logits of the rows inside a parameter body.

Invariants:
- The input is only read; the result is ``(values [N, 2] float32, indices [N, 2] int64)``, the
  largest first (``torch.topk(logits, 2, dim=-1)`` is the oracle).
- The CUDA path (``kernels/top2.cu``, one block per row) handles contiguous float32 rows with
  ``V >= 2`` and routes anything else to ``forward_native``; on ties it takes the lower index.
"""

from __future__ import annotations

import torch

from metrale_core.api import CustomOp, i32, ptr, torch_stream

__all__ = ["Top2"]

#: Threads per block of ``top2_rows_f32`` (a multiple of 32, at most 1024).
_THREADS = 512


class Top2(CustomOp):
    """``op(logits) -> (values, indices)``: per row, the two largest logits and their ids."""

    kernel_package = "metrale_b1"
    kernel_file = "top2.cu"

    def forward_native(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.topk(logits, 2, dim=-1)
        return values, indices

    def forward_cuda(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.dtype != torch.float32 or logits.ndim != 2 or logits.shape[1] < 2 or not logits.is_contiguous():
            return self.forward_native(logits)
        rows, vocab = logits.shape
        values = torch.empty(rows, 2, dtype=torch.float32, device=logits.device)
        indices = torch.empty(rows, 2, dtype=torch.int64, device=logits.device)
        if rows:
            with torch_stream(logits.device):
                self.kernel("top2_rows_f32")((rows,), (_THREADS,), (ptr(logits), ptr(values), ptr(indices), i32(vocab)))
        return values, indices
