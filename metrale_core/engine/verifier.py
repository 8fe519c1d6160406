"""Verify chunks, from the target's logits to committed tokens (speculative decoding).

Owner: ``OutputProcessor.update`` hands it the step's verify chunks (kind ``VERIFY``, rows
``[last, d1..dk]``) with their ``k+1`` logits rows each.

In order, per step:
1. One batched pipeline pass over every verify row with ``PositionKind.VERIFY`` (row ``i`` sees
   the committed output plus ``d1..d_{i-1}`` as its history): processors, penalties, bias, then
   the sampler's processing (temperature, top-k/p, min-p).
2. Per sequence, ``speculation.accept`` on the processed rows and the proposer's ``q``.
3. The accepted drafts, then the recovered / bonus token, are committed one by one through the
   normal append path (stop tokens, stop strings, ``max_tokens``, context length): a stop
   mid-draft drops every later token.  Before each commit the pipeline's ``FINAL_DECODE`` stages
   (observers such as B1) see that position's logits, so a rejected position never reaches them.
4. ``Scheduler.commit_verify`` rolls the sequence length back to the committed tokens (K/V of
   rejected rows is discarded with the blocks past it).

Invariants:
- The deltas of one sequence are merged into one ``RequestOutput`` (tokens, text, logprobs and
  any parsed deltas concatenated; the rest from the last commit).
- Nothing here touches the model: recurrent state is rolled back by the engine
  (``ModelRunner.commit_verify``) from the returned outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch

from metrale_core.engine.deltas import merge_outputs
from metrale_core.engine.speculation import VerifyOutcome, accept, verify_rows
from metrale_core.sampling.position import PositionKind

__all__ = ["commit_verify_chunks"]


def _logprob_entry(row: torch.Tensor, token: int, width: int) -> tuple:
    """``((token, logprob, top),)`` from one row of log-probabilities."""
    top: tuple[tuple[int, float], ...] = ()
    if width:
        values, ids = row.topk(min(width, row.shape[0]))
        top = tuple((int(t), float(v)) for t, v in zip(ids.tolist(), values.tolist()) if v != float("-inf"))
    return ((token, float(row[token]), top),)


def commit_verify_chunks(
    processor: Any, chunks: Seq[Any], logits: Seq[torch.Tensor]
) -> tuple[list[Any], list[VerifyOutcome]]:
    """Accept and commit every verify chunk; returns one output per chunk and the outcomes.

    ``processor`` is the ``OutputProcessor`` (its pipeline, scheduler and ``commit_token``);
    ``logits[j]`` holds the ``k+1`` rows of ``chunks[j]``, whose ``draft`` is the proposer's
    ``Draft`` record (``q``).
    """
    pipeline = processor.pipeline
    rows: list[Any] = []
    for chunk in chunks:
        rows.extend(verify_rows(chunk.seq, chunk.token_ids[1:]))
    stacked = torch.cat(list(logits))
    adjusted = pipeline.adjusted_logits(stacked, rows, [PositionKind.VERIFY] * len(rows))
    processed = pipeline.sampler.process(adjusted, rows)
    observe = pipeline.runs_on(PositionKind.FINAL_DECODE)
    outputs, outcomes = [], []
    lo = 0
    for chunk, chunk_logits in zip(chunks, logits):
        seq, draft = chunk.seq, chunk.token_ids[1:]
        hi = lo + len(draft) + 1
        source = chunk.draft
        probs = None if source is None or source.probs is None else source.probs[: len(draft)]
        greedy = seq.params.temperature == 0.0
        verdict = accept(processed[lo:hi], draft, probs, greedy=greedy, generator=seq.generator)
        wants_logprobs = seq.params.logprobs is not None
        if wants_logprobs:
            logprobs = torch.log_softmax(adjusted[lo:hi] if greedy else processed[lo:hi], dim=-1)
        deltas = []
        for j, token in enumerate(verdict.token_ids):
            if observe:  # this position is committed: final-decode observers may see it now
                pipeline.adjusted_logits(chunk_logits[j : j + 1], [seq], [PositionKind.FINAL_DECODE])
            entry = _logprob_entry(logprobs[j], token, seq.params.logprobs) if wants_logprobs else None
            deltas.append(processor.commit_token(seq, token, entry))
            if seq.is_finished:
                break
        processor.scheduler.commit_verify(chunk, verdict.num_accepted)
        outputs.append(merge_outputs(deltas))
        outcomes.append(
            VerifyOutcome(
                request_id=seq.request_id,
                num_proposed=len(draft),
                num_accepted=verdict.num_accepted,
                num_emitted=len(deltas),
                finished=seq.is_finished,
            )
        )
        lo = hi
    return outputs, outcomes
