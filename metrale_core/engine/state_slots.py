"""``StateSlots``: the pool of recurrent-state slots (one per running sequence).

Owner: the scheduler.  A model with recurrent layers (``model.info.has_recurrent_state``) keeps
per-sequence state in a pool the runner allocates with ``model.make_state_pool(num_slots)``;
this class only hands out the slot indices.

Invariants:
- A sequence holds a slot exactly while it is RUNNING: the slot is taken when it is first
  scheduled and given back on finish, abort, timeout, error and preemption.
- A slot's state is never trusted across owners: the first chunk a sequence runs after taking
  a slot starts at position 0 with ``state_fresh`` True (prefix caching is off for such models
  and preemption replays from position 0), so the model resets the slot before consuming.
"""

from __future__ import annotations

from attrs import define, field

from metrale_core.engine.request import Sequence

__all__ = ["StateSlots"]


@define
class StateSlots:
    """Free list of ``num_slots`` slot indices; disabled (no slots needed) when ``enabled`` is False."""

    num_slots: int
    enabled: bool
    _free: list[int] = field(init=False)

    def __attrs_post_init__(self) -> None:
        # Pop from the end: the lowest slot index is handed out first.
        self._free = list(range(self.num_slots - 1, -1, -1)) if self.enabled else []

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self) -> bool:
        return not self.enabled or bool(self._free)

    def allocate(self, seq: Sequence) -> None:
        if not self.enabled:
            return
        if seq.state_slot != -1:
            raise RuntimeError(f"{seq!r} already holds state slot {seq.state_slot}")
        if not self._free:
            raise RuntimeError("no free recurrent-state slot; check can_allocate first")
        seq.state_slot = self._free.pop()

    def free(self, seq: Sequence) -> None:
        if seq.state_slot == -1:
            return
        self._free.append(seq.state_slot)
        seq.state_slot = -1
