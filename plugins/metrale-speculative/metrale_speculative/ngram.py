"""``NgramProposer``: prompt-lookup drafting (specs §4.4).

Owner: registered as proposer ``ngram``; runs on the CPU over each sequence's token ids.

Rule: find the longest ``n`` in ``[min_n, max_n]`` whose last-``n``-token suffix also occurs
earlier in the context; among matches of that length take the earliest occurrence; propose the
up to ``k`` tokens that followed it.  No match (or a context shorter than ``min_n + 1``) gives
no draft.  Example: ``[1,2,3,4,2,3]``, n in [2,3], k=4 -> ``[4,2,3]``.

Invariants: no draft probabilities (verification uses one-hot ``q``); stateless between steps.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from metrale_core.api import Draft, StepReport

__all__ = ["NgramProposer", "ngram_draft"]


def ngram_draft(tokens: Seq[int], min_n: int, max_n: int, k: int) -> tuple[int, ...]:
    """The n-gram draft for context ``tokens`` (see the module docstring)."""
    size = len(tokens)
    if k <= 0 or size < min_n + 1:
        return ()
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = arr[size - n :]
        windows = sliding_window_view(arr[: size - 1], n)  # starts 0 .. size-1-n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tuple(int(t) for t in arr[start : start + k])
    return ()


class NgramProposer:
    """Stateless prompt-lookup proposer."""

    wants_hidden = False

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs: Seq[Any], max_drafts: Seq[int]) -> list[Draft | None]:
        out: list[Draft | None] = []
        for seq, k in zip(seqs, max_drafts):
            tokens = ngram_draft(seq.all_token_ids(), self.min_n, self.max_n, k)
            out.append(Draft(tokens) if tokens else None)
        return out

    def observe(self, report: StepReport) -> None:
        return None
