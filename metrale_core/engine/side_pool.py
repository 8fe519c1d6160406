"""``SidePool``: a second model's own paged KV pool, laid out exactly like the engine's.

Owner: speculative proposers that run a model of their own (a draft model, an MTP layer) build
one through ``ProposerContext.side_pool(model, num_blocks)`` (or directly), instead of putting
a ``BlockManager`` and a ``ModelRunner`` together by hand.  Their forwards then follow the same
model contract (``ForwardBatch``, paged KV) as the target's.

Invariants:
- The pool never prefix-caches and keeps no recurrent state: a model with recurrent state is
  refused (``ConfigError``), since a drafter's positions are overwritten, never rolled back.
- A "sequence" here is anything with ``request_id`` and a mutable ``block_ids`` list (what the
  ``BlockManager`` reads; plus ``group_block_ids`` for a model with attention windows, whose
  groups the pool keeps whole: it never slides); chunks sample their last row at ``FINAL_DECODE``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from metrale_core.engine.block_manager import BlockManager
from metrale_core.engine.plan import ScheduledChunk, SchedulerOutput
from metrale_core.engine.runner import ModelRunner
from metrale_core.errors import ConfigError
from metrale_core.sampling.position import PositionKind

__all__ = ["SidePool"]


class SidePool:
    """A ``ModelRunner`` (no state slots) and a ``BlockManager`` (no prefix caching) for one
    side model."""

    def __init__(self, model: Any, num_blocks: int, block_size: int, kv_storage: Any = None) -> None:
        """``kv_storage``: the pool's ``kv_dtype.KVStorage`` (None: the model's plain layout)."""
        if model.info.has_recurrent_state:
            raise ConfigError(
                f"{model.info.architecture} keeps recurrent state; a drafter must be an attention-only model"
            )
        self.runner = ModelRunner(model, num_blocks, block_size, 0, kv_storage)
        kv = model.info.kv
        self.blocks = BlockManager(
            num_blocks,
            block_size,
            enable_prefix_caching=False,
            windows=kv.groups.windows if kv is not None else (None,),
        )

    @staticmethod
    def chunk(seq: Any, start: int, token_ids: Iterable[int]) -> ScheduledChunk:
        """Rows ``token_ids`` of ``seq`` at positions ``start..``; logits of the last row only."""
        return ScheduledChunk(
            seq=seq,
            start=start,
            token_ids=tuple(token_ids),
            block_ids=tuple(seq.block_ids),
            state_slot=-1,
            sample=True,
            group_block_ids=tuple(tuple(t) for t in getattr(seq, "group_block_ids", ())),
            kind=PositionKind.FINAL_DECODE,
            is_decode=False,
        )

    @staticmethod
    def plan(chunks: Iterable[ScheduledChunk]) -> SchedulerOutput:
        """A plan of ``chunks`` (run them with ``runner.execute`` or ``runner.build_batch``)."""
        return SchedulerOutput(tuple(chunks))

    def execute(self, chunks: Iterable[ScheduledChunk]) -> torch.Tensor | None:
        """Run the side model over ``chunks``; the logits of each chunk's last row."""
        return self.runner.execute(self.plan(chunks)).logits
