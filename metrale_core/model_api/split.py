"""``StepSplit``: which sequences of one step feed a single row and which feed several.

Owner: ``metrale_core.model_api`` (the model contract).  The scheduler's plan
(``engine.plan.SchedulerOutput``) builds it once, when the plan is made; the model runner hands
that same record to the model as ``ForwardBatch.split``; attention (``AttentionPlan.from_batch``)
and every other consumer read it instead of classifying the rows again.

The split is attention's notion, not the scheduler's: a *one-row* sequence is any sequence that
feeds exactly one row this step, whatever the scheduler calls it (a decode row, or a one-token
prefill chunk after a prefix-cache hit); every sequence with more rows is a *multi-row* segment
(a prefill chunk, or a speculative verify chunk ``[last, d1..dk]``, which the scheduler counts
as a decode: ``ScheduledChunk.is_decode`` / ``ForwardBatch.verify_host`` carry that notion).

Invariants:
- :meth:`StepSplit.of_lengths` is the only place the classification is derived from row counts;
  the engine calls it once per plan (a test counts the calls).
- ``one_row_seqs`` and ``multi_row`` are in batch order; a sequence with no rows is in neither.
- ``one_row_rows[j]`` is the row of sequence ``one_row_seqs[j]``; ``multi_row`` segments are
  ``(row_start, row_end, sequence_index)``.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrs import frozen

__all__ = ["StepSplit"]


@frozen
class StepSplit:
    """The one-row sequences and the multi-row segments of a step's flat batch of rows."""

    #: Sequences in the batch.
    num_seqs: int
    #: Indices of the sequences that feed exactly one row, in batch order.
    one_row_seqs: tuple[int, ...]
    #: The row of each of those sequences (same order).
    one_row_rows: tuple[int, ...]
    #: ``(row_start, row_end, sequence_index)`` of each sequence that feeds more than one row.
    multi_row: tuple[tuple[int, int, int], ...]

    @property
    def is_pure_decode(self) -> bool:
        """Every sequence feeds exactly one row (the batched decode fast path)."""
        return len(self.one_row_seqs) == self.num_seqs

    @classmethod
    def of_lengths(cls, query_lens: Iterable[int]) -> StepSplit:
        """The split of a batch whose sequence ``i`` feeds ``query_lens[i]`` rows, laid out
        back to back in sequence order."""
        lens = tuple(query_lens)
        seqs: list[int] = []
        rows: list[int] = []
        multi: list[tuple[int, int, int]] = []
        start = 0
        for i, n in enumerate(lens):
            if n == 1:
                seqs.append(i)
                rows.append(start)
            elif n > 1:
                multi.append((start, start + n, i))
            start += n
        return cls(len(lens), tuple(seqs), tuple(rows), tuple(multi))
