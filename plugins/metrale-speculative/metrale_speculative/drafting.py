"""Sampling draft tokens from a drafter's logits with the engine's own pipeline.

Owner: the draft-model and MTP proposers.  Leviathan/Chen verification is lossless only when
each draft ``d_i`` is drawn from the same ``q_i`` the verifier divides by, and the verifier
compares against the *processed* target distribution; so drafter logits go through the same
``LogitPipeline.processed_logits`` (kind ``VERIFY``, history = committed output + earlier
drafts) as the target's verify rows.

Invariants: greedy rows take the argmax and carry no ``q`` (verification ignores it); sampled
rows draw one uniform from the request's own generator per draft.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch

from metrale_core.api import PositionKind, VerifyRow, inverse_cdf

__all__ = ["sample_drafts"]


def sample_drafts(
    pipeline: Any, logits: torch.Tensor, seqs: Seq[Any], drafts_so_far: Seq[Seq[int]]
) -> tuple[list[int], list[torch.Tensor | None]]:
    """One draft token per row of ``[B, V]`` ``logits``, and its ``q`` row (None when greedy)."""
    rows = [VerifyRow(seq, tuple(seq.output_ids) + tuple(prev)) for seq, prev in zip(seqs, drafts_so_far)]
    processed = pipeline.processed_logits(logits.float(), rows, [PositionKind.VERIFY] * len(rows))
    tokens: list[int] = []
    probs: list[torch.Tensor | None] = []
    for i, seq in enumerate(seqs):
        if seq.params.temperature == 0.0:
            tokens.append(int(processed[i].argmax()))
            probs.append(None)
            continue
        q = torch.softmax(processed[i].cpu(), dim=-1)
        gen = seq.generator
        u = torch.rand(1, generator=gen, device=gen.device if gen is not None else "cpu")
        tokens.append(int(inverse_cdf(q[None, :], u.cpu().to(q.dtype))[0]))
        probs.append(q)
    return tokens, probs
