"""``KdaStatePool``: per-slot recurrent and short-conv state of every KDA layer.

Owner: ``metrale_glm_kda``.  The engine allocates one pool (``model.make_state_pool(num_slots)``)
and hands it back to every ``forward``; the scheduler decides which slot a sequence holds.

Invariants:
- ``recurrent[j]`` is float32 ``[num_slots, H, K, V]`` (key rows, value columns) for the j-th KDA
  layer; ``conv[j]`` is ``[num_slots, 3 * H * K, kernel - 1]`` in the model dtype and holds the
  last ``kernel - 1`` pre-conv q/k/v projections, oldest first.
- A slot is zeroed (``reset``) before a sequence starting at position 0 consumes anything, so
  no state survives from a previous owner; otherwise only speculative rollback (``verify``)
  writes a slot from outside the forward.
- Speculative verify (checkpoint + replay): ``verify`` is the :class:`VerifyLog` of the latest
  forward that had verify chunks (None otherwise, and cleared at the start of every forward).
  It holds, per KDA layer and verify sequence, the slot's state *before* the chunk and the
  chunk's per-row recurrent inputs, so ``rollback`` can restore the checkpoint and replay the
  kept rows with the very same ops and shapes as the forward (bit-exact on any device).
"""

from __future__ import annotations

import torch
from attrs import define, field, frozen

from metrale_glm_kda.config import GlmDims

__all__ = ["KdaStatePool", "VerifyLog", "VerifyRecord", "state_bytes_per_sequence"]


def state_bytes_per_sequence(dims: GlmDims, dtype: torch.dtype) -> int:
    """Bytes of recurrent (float32) plus conv state across all KDA layers for one sequence."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    recurrent = dims.linear_num_heads * dims.linear_head_dim * dims.linear_head_dim * 4
    conv = 3 * dims.linear_dim * (dims.conv_kernel - 1) * itemsize
    return len(dims.kda_layers) * (recurrent + conv)


@frozen
class VerifyRecord:
    """One verify chunk's consumption by one KDA layer: the state before it and its row inputs.

    ``raw`` ``[n, C]`` are the pre-conv projections (the conv window is a copy of them);
    ``q, k`` ``[n, 1, H, K]`` float32 (normalised), ``v`` ``[n, 1, H, V]``, ``g`` ``[n, 1, H, K]``,
    ``beta`` ``[n, 1, H]`` are the recurrence inputs exactly as ``kda_recurrent`` consumed them.
    """

    rec: torch.Tensor
    conv: torch.Tensor
    raw: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor


@define
class VerifyLog:
    """What the latest forward's verify chunks fed: ``records[slot][layer]``, ``rows[slot]``."""

    rows: dict[int, int] = field(factory=dict)
    records: dict[int, dict[int, VerifyRecord]] = field(factory=dict)


@define
class KdaStatePool:
    """The state tensors of ``num_slots`` sequences; see the module docstring."""

    recurrent: list[torch.Tensor]
    conv: list[torch.Tensor]
    #: Checkpoints + inputs of the latest forward's verify chunks (see the module docstring).
    verify: VerifyLog | None = None

    @classmethod
    def allocate(cls, dims: GlmDims, num_slots: int, dtype: torch.dtype, device: torch.device | str) -> KdaStatePool:
        n = len(dims.kda_layers)
        h, d = dims.linear_num_heads, dims.linear_head_dim
        rec = (num_slots, h, d, d)
        conv = (num_slots, 3 * dims.linear_dim, dims.conv_kernel - 1)
        return cls(
            recurrent=[torch.zeros(rec, dtype=torch.float32, device=device) for _ in range(n)],
            conv=[torch.zeros(conv, dtype=dtype, device=device) for _ in range(n)],
        )

    @property
    def num_slots(self) -> int:
        return self.recurrent[0].shape[0] if self.recurrent else 0

    def reset(self, slots: torch.Tensor) -> None:
        """Zero the state of ``slots`` (int64 ``[n]``) in every layer."""
        if slots.numel() == 0:
            return
        for rec, conv in zip(self.recurrent, self.conv):
            rec.index_fill_(0, slots, 0.0)
            conv.index_fill_(0, slots, 0.0)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.recurrent, *self.conv))
