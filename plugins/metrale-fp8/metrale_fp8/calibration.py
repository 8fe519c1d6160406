"""Online calibration of one attention layer's FP8 K/V scales.

Owner: ``metrale_fp8.codec``: one :class:`LayerCalibration` per FP8 layer while its window is open.

Invariants:
- ``observe`` counts every row written (across requests and steps, a readiness probe included)
  and keeps the running per-tensor ``max |K|`` (K as cached: after k-norm and RoPE) and
  ``max |V|``; the window closes once ``observed >= window`` (``window == 1`` closes on the first
  observation, whatever its size).
- Until the freeze, written rows are held at model precision (``staged_*``), keyed by slot; a slot
  written again overwrites its row.  ``overlay`` puts them into gathered K/V, so pre-freeze
  tokens read back exactly as written.  The codec requantizes them with the frozen scale, so the
  write scale equals the read scale for every token.  A row whose slot another layer of the same
  pool tensor wrote since (KV groups of a windowed model) is forgotten: never overlaid, never
  written back.
"""

from __future__ import annotations

import torch
from attrs import define, field

__all__ = ["LayerCalibration"]


@define
class LayerCalibration:
    """The open calibration window of one layer."""

    #: Tokens to observe before freezing.
    window: int
    #: Tokens observed so far.
    observed: int = 0
    #: Running ``max |K|`` / ``max |V|`` (0-d float32 on the cache device), None before any token.
    k_amax: torch.Tensor | None = None
    v_amax: torch.Tensor | None = None
    #: Flat slots of the held rows, and the rows at model precision.
    staged_slots: torch.Tensor | None = None
    staged_k: torch.Tensor | None = None
    staged_v: torch.Tensor | None = None
    #: ``[num_slots]`` int64: index of a slot's held row, -1 when none.
    _lookup: torch.Tensor | None = field(default=None, repr=False)

    @property
    def ready(self) -> bool:
        """The window is full: freeze now."""
        return self.observed >= self.window

    def observe(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Count ``k``/``v`` ``[T, Hk, d]`` and fold their magnitudes into the running amax."""
        if k.shape[0] == 0:
            return
        k_max, v_max = k.detach().abs().amax().float(), v.detach().abs().amax().float()
        self.k_amax = k_max if self.k_amax is None else torch.maximum(self.k_amax, k_max)
        self.v_amax = v_max if self.v_amax is None else torch.maximum(self.v_amax, v_max)
        self.observed += int(k.shape[0])

    def hold(self, num_slots: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep rows ``k``/``v`` ``[T, Hk, d]`` for ``slot_mapping`` ``[T]`` at model precision."""
        if self._lookup is None:
            self._lookup = torch.full((num_slots,), -1, dtype=torch.int64, device=k.device)
            self.staged_slots = slot_mapping.new_empty((0,))
            self.staged_k, self.staged_v = k.new_empty((0, *k.shape[1:])), v.new_empty((0, *v.shape[1:]))
        assert self.staged_slots is not None and self.staged_k is not None and self.staged_v is not None
        index = self._lookup[slot_mapping]
        old = index >= 0
        if bool(old.any()):
            self.staged_k[index[old]] = k[old].to(self.staged_k.dtype)
            self.staged_v[index[old]] = v[old].to(self.staged_v.dtype)
        new = ~old
        count = int(new.sum())
        if count:
            start = self.staged_slots.shape[0]
            self._lookup[slot_mapping[new]] = torch.arange(start, start + count, device=k.device)
            self.staged_slots = torch.cat([self.staged_slots, slot_mapping[new]])
            self.staged_k = torch.cat([self.staged_k, k[new].to(self.staged_k.dtype)])
            self.staged_v = torch.cat([self.staged_v, v[new].to(self.staged_v.dtype)])

    def forget(self, slot_mapping: torch.Tensor) -> None:
        """Drop the held rows of ``slot_mapping`` (another layer sharing this layer's pool tensor,
        a KV group of a windowed model, now owns those slots): they are neither overlaid nor
        written at the freeze."""
        if self._lookup is None:
            return
        assert self.staged_slots is not None  # staged with the lookup
        index = self._lookup[slot_mapping]
        held = index >= 0
        if bool(held.any()):
            self.staged_slots[index[held]] = -1
            self._lookup[slot_mapping[held]] = -1

    def live(self) -> torch.Tensor:
        """``[n]`` bool: which held rows still belong to this layer (not forgotten)."""
        assert self.staged_slots is not None, "live() of a calibration that holds no rows"
        return self.staged_slots >= 0

    def overlay(self, block_ids: torch.Tensor, block_size: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put the held rows into gathered ``k``/``v`` ``[..., nb * bs, Hk, d]`` of ``block_ids``."""
        if self._lookup is None:
            return
        assert self.staged_k is not None and self.staged_v is not None  # staged with the lookup
        offsets = torch.arange(block_size, device=block_ids.device)
        slots = (block_ids[..., None] * block_size + offsets).reshape(*block_ids.shape[:-1], -1)
        index = self._lookup[slots]
        held = index >= 0
        if bool(held.any()):
            k[held] = self.staged_k[index[held]].to(k.dtype)
            v[held] = self.staged_v[index[held]].to(v.dtype)

    def amax(self) -> tuple[float, float]:
        """``(max |K|, max |V|)`` observed (0.0 before any token)."""
        k = 0.0 if self.k_amax is None else float(self.k_amax)
        v = 0.0 if self.v_amax is None else float(self.v_amax)
        return k, v
