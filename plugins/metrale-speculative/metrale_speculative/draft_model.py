"""``DraftModelProposer``: a smaller model sharing the tokenizer drafts k tokens, batched.

Owner: registered as proposer ``draft`` (``--speculative draft --draft-model PATH``).

Per step, for the offered sequences (all in one batch per forward):
1. catch-up: feed the committed tokens the drafter has not seen (``computed .. len``); the last
   row's logits give ``d_1``;
2. ``k - 1`` more single-row forwards feed ``d_i`` and give ``d_{i+1}``;
each ``d_i`` is drawn from the processed drafter distribution ``q_i`` (``drafting``).
Afterwards ``computed = len``: the drafter's KV past the committed tokens holds drafts that the
next catch-up overwrites.

Invariants: the drafter's vocabulary must match the target's (checked at construction);
sequences whose drafter KV does not fit get no draft this step (never an error).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from metrale_core.api import ConfigError, Draft, StepReport
from metrale_speculative.drafting import sample_drafts
from metrale_speculative.side_cache import SideCache

__all__ = ["DraftModelProposer"]


class DraftModelProposer:
    """Drafts with its own model and KV cache."""

    wants_hidden = False

    def __init__(
        self, draft_model: Any, target_info: Any, pipeline: Any, *, num_blocks: int, block_size: int = 16
    ) -> None:
        if draft_model.info.vocab_size != target_info.vocab_size:
            raise ConfigError(
                f"draft model vocabulary ({draft_model.info.vocab_size}) differs from the target's "
                f"({target_info.vocab_size}); use a draft model with the same tokenizer"
            )
        self.model = draft_model
        self.pipeline = pipeline
        self.cache = SideCache(draft_model, num_blocks, block_size)

    def __repr__(self) -> str:
        return f"DraftModelProposer({self.model.info.architecture})"

    def propose(self, seqs: Seq[Any], max_drafts: Seq[int]) -> list[Draft | None]:
        cache = self.cache
        cache.retain(seq.request_id for seq in seqs)
        live = []  # (index, seq, state, cap)
        for i, (seq, cap) in enumerate(zip(seqs, max_drafts)):
            if cap <= 0:
                continue
            ds = cache.reserve(seq.request_id, seq.num_tokens + cap - 1)
            if ds is not None:
                live.append((i, seq, ds, cap))
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list] = [[] for _ in seqs]
        step = 0
        while live:
            chunks = []
            for i, seq, ds, _ in live:
                if step == 0:
                    tokens = seq.all_token_ids()
                    chunks.append(cache.chunk(ds, ds.computed, tokens[ds.computed :]))
                else:
                    chunks.append(cache.chunk(ds, seq.num_tokens - 1 + step, (drafts[i][-1],)))
            logits = cache.runner.execute(cache.plan(chunks)).logits
            assert logits is not None  # the plan has a chunk per live sequence
            tokens, qs = sample_drafts(
                self.pipeline, logits, [seq for _, seq, _, _ in live], [drafts[i] for i, _, _, _ in live]
            )
            for (i, seq, ds, _), token, q in zip(live, tokens, qs):
                drafts[i].append(token)
                probs[i].append(q)
                if step == 0:
                    ds.computed = seq.num_tokens
            step += 1
            live = [entry for entry in live if len(drafts[entry[0]]) < entry[3]]
        return [_draft(d, p) for d, p in zip(drafts, probs)]

    def observe(self, report: StepReport) -> None:
        return None


def _draft(tokens: list[int], probs: list) -> Draft | None:
    if not tokens:
        return None
    if any(p is None for p in probs):
        return Draft(tokens)
    import torch

    return Draft(tokens, torch.stack(probs))
