"""``SideCache``: a drafter's own paged KV cache, one block list per request.

Owner: the draft-model and MTP proposers.  A drafter runs its own model over the committed
tokens of each sequence (catch-up) and then over its own drafts; its pool is the core's
``SidePool`` (the engine's ``BlockManager`` and ``ModelRunner``, built by the core) so its
forwards follow the same model contract as the target's.

Invariants:
- ``computed[rid]`` positions of a request hold K/V of committed tokens only; draft positions
  past it are overwritten by the next catch-up (attention-only drafters need no other
  rollback).
- A request that is no longer offered for drafting is forgotten (its blocks freed) at the next
  :meth:`SideCache.retain`; it catches up from position 0 if it comes back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attrs import define, field

from metrale_core.api import SidePool

__all__ = ["DraftSeq", "SideCache"]


@define(eq=False)
class DraftSeq:
    """A drafter's per-request state (a ``BlockManager`` ``BlockHolder``: request id and blocks)."""

    request_id: str
    block_ids: list[int] = field(factory=list)
    #: Block tables of the drafter's KV groups after the first (a drafter with windows).
    group_block_ids: list[list[int]] = field(factory=list)
    #: Positions whose K/V hold committed tokens.
    computed: int = 0


class SideCache:
    """Per-request KV blocks of one drafter model plus its runner."""

    #: ``chunk(ds, start, token_ids)`` and ``plan(chunks)`` of the core's ``SidePool``.
    chunk = staticmethod(SidePool.chunk)
    plan = staticmethod(SidePool.plan)

    def __init__(self, model: Any, num_blocks: int, block_size: int) -> None:
        self.pool = SidePool(model, num_blocks, block_size)  # refuses recurrent-state models
        self.runner = self.pool.runner
        self.blocks = self.pool.blocks
        self.seqs: dict[str, DraftSeq] = {}

    def retain(self, request_ids: Iterable[str]) -> None:
        """Forget every request not in ``request_ids``."""
        keep = set(request_ids)
        for rid in [r for r in self.seqs if r not in keep]:
            self.blocks.free(self.seqs.pop(rid))

    def reserve(self, request_id: str, num_positions: int) -> DraftSeq | None:
        """The request's state with blocks for ``num_positions`` positions, or None (pool full)."""
        ds = self.seqs.setdefault(request_id, DraftSeq(request_id))
        if self.blocks.num_new_blocks(ds, num_positions) > self.blocks.num_free_blocks:
            return None
        self.blocks.grow(ds, num_positions)
        return ds
