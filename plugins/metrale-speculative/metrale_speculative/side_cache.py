"""``SideCache``: a drafter's own paged KV cache, one block list per request.

Owner: the draft-model and MTP proposers.  A drafter runs its own model over the committed
tokens of each sequence (catch-up) and then over its own drafts; it reuses the engine's
``BlockManager`` (no prefix caching) and ``ModelRunner`` (batch layout, KV pool) so its
forwards follow the same model contract as the target's.

Invariants:
- ``computed[rid]`` positions of a request hold K/V of committed tokens only; draft positions
  past it are overwritten by the next catch-up (attention-only drafters need no other
  rollback).
- A request that is no longer offered for drafting is forgotten (its blocks freed) at the next
  :meth:`SideCache.retain`; it catches up from position 0 if it comes back.
"""

from __future__ import annotations

from typing import Any, Iterable

from attrs import define, field

from metrale_core.api import (
    BlockManager,
    ConfigError,
    ModelRunner,
    PositionKind,
    ScheduledChunk,
    SchedulerOutput,
)

__all__ = ["DraftSeq", "SideCache"]


@define(eq=False)
class DraftSeq:
    """A drafter's per-request state (duck-types what ``BlockManager`` reads of a sequence)."""

    request_id: str
    block_ids: list[int] = field(factory=list)
    #: Positions whose K/V hold committed tokens.
    computed: int = 0


class SideCache:
    """Per-request KV blocks of one drafter model plus its runner."""

    def __init__(self, model: Any, num_blocks: int, block_size: int) -> None:
        if model.info.has_recurrent_state:
            raise ConfigError(f"{model.info.architecture} keeps recurrent state; a drafter must "
                              "be an attention-only model")
        self.runner = ModelRunner(model, num_blocks, block_size, 0)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
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

    @staticmethod
    def chunk(ds: DraftSeq, start: int, token_ids: tuple[int, ...]) -> ScheduledChunk:
        """Rows ``token_ids`` at ``start..``; logits of the last row only."""
        return ScheduledChunk(seq=ds, start=start, token_ids=tuple(token_ids),
                              block_ids=tuple(ds.block_ids), state_slot=-1, sample=True,
                              kind=PositionKind.FINAL_DECODE, is_decode=False)

    @staticmethod
    def plan(chunks: list[ScheduledChunk]) -> SchedulerOutput:
        return SchedulerOutput(tuple(chunks))
