"""The plan of one step: the scheduler's output, read by the model runner and the output processor.

Owner: ``metrale_core.engine``; only :class:`~metrale_core.engine.scheduler.Scheduler` builds
these records.

Invariants:
- A :class:`SchedulerOutput` lists decode rows first (running order), then prefill chunks
  (admission order).
- A :class:`ScheduledChunk` feeds tokens ``[start, start + len(token_ids))`` of one sequence; the
  records are frozen (a step's plan does not change once made).
- A :class:`SchedulerOutput` computes its ``split`` (one-row sequences vs multi-row segments,
  ``model_api.StepSplit``) once, when it is made, from its chunks; nothing downstream (runner,
  attention, models) classifies the rows again.  The scheduler's own decode/prefill split is
  the chunks' ``is_decode`` flag, read through ``decode_chunks`` / ``num_prefill_tokens``.
"""

from __future__ import annotations

from typing import Any

from attrs import Factory, field, frozen

from metrale_core.engine.request import Sequence
from metrale_core.model_api.split import StepSplit
from metrale_core.sampling.position import PositionKind

__all__ = ["ScheduledChunk", "SchedulerOutput"]


@frozen(repr=False)
class ScheduledChunk:
    """Rows of one sequence in one step."""

    #: The sequence (read by the runner and the output processor).
    seq: Sequence = field(eq=False)
    #: Absolute position of the first row.
    start: int
    #: Token ids fed at positions ``start .. start + len - 1``.
    token_ids: tuple[int, ...]
    #: The sequence's block table for this step.
    block_ids: tuple[int, ...]
    #: Recurrent-state slot (-1 when the model keeps none).
    state_slot: int
    #: The last row's logits are sampled (the chunk reaches the end of the sequence).
    sample: bool
    #: Position kind of the sampled row (None when ``sample`` is False).
    kind: PositionKind | None
    #: A single-token decode row (as opposed to a prefill chunk); a verify chunk
    #: ``[last, d1..dk]`` (kind ``VERIFY``) is a decode row too.
    is_decode: bool
    #: The proposer's ``Draft`` record of a verify chunk (its ``probs`` are ``q`` for the
    #: acceptance rule); None for every other chunk.
    draft: Any = field(default=None, eq=False)
    #: The block tables of the sequence's KV groups after the first, for this step (empty
    #: without attention windows; ``NULL_BLOCK`` where a block slid out of the window).
    group_block_ids: tuple[tuple[int, ...], ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_verify(self) -> bool:
        return self.kind is PositionKind.VERIFY

    @property
    def num_logits(self) -> int:
        """Logits rows this chunk needs: every row of a verify chunk, else the sampled one."""
        return self.num_tokens if self.is_verify else int(self.sample)

    def __repr__(self) -> str:
        return (
            f"ScheduledChunk({self.seq.request_id!r}, start={self.start}, "
            f"n={len(self.token_ids)}, sample={self.sample})"
        )


@frozen
class SchedulerOutput:
    """The plan of one step."""

    #: Decode rows first (running order), then prefill chunks (admission order).
    chunks: tuple[ScheduledChunk, ...] = ()
    #: Request ids preempted (by recompute) while planning this step.
    preempted: tuple[str, ...] = ()
    #: Sequences the scheduler finished since the last plan (abort, timeout, error), to report.
    finished: tuple[Sequence, ...] = field(default=(), eq=False)
    #: The step's one-row sequences and multi-row segments, in chunk order (attention's split:
    #: a one-token prefill chunk is a one-row sequence, a verify chunk a multi-row one); made
    #: here once, carried to the model as ``ForwardBatch.split``.
    split: StepSplit = field(
        init=False,
        eq=False,
        repr=False,
        default=Factory(lambda self: StepSplit.of_lengths(c.num_tokens for c in self.chunks), takes_self=True),
    )

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls()

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    @property
    def decode_chunks(self) -> tuple[ScheduledChunk, ...]:
        """The scheduler's decode chunks (a running sequence's next row, or its verify chunk),
        as it classified them: the scheduling split, not attention's (see ``split``)."""
        return tuple(c for c in self.chunks if c.is_decode)

    @property
    def num_prefill_tokens(self) -> int:
        """Rows of the scheduler's prefill chunks (prompt tokens consumed this step)."""
        return sum(c.num_tokens for c in self.chunks if not c.is_decode)
