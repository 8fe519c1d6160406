"""``DefaultSampler``: greedy, temperature, top-k, top-p, min-p, per-request seeds and logprobs.

Owner: registered as the built-in sampler ``"default"``; the logit pipeline calls it last.

Steps of :meth:`DefaultSampler.sample`, on logits that already carry penalties and bias:
1. Rows are split with index masks into greedy rows (temperature 0) and sampled rows.
2. Greedy rows: argmax, the first maximal logit wins.  They consume no random numbers.
3. Sampled rows (:func:`truncate`): divide by the temperature, then top-k, then top-p (keep the
   smallest set of most likely tokens whose mass reaches ``top_p``: sorted descending, token ``i``
   is kept iff the mass before it is ``< top_p``, on the distribution renormalised after top-k),
   then min-p (drop tokens whose probability is below ``min_p`` times the top probability);
   removed tokens become ``-inf`` and softmax renormalises the rest.
4. Each sampled row draws exactly one uniform ``u = torch.rand(1, generator=row.generator)``
   and takes the first token whose cumulative probability exceeds ``u`` (inverse CDF, vectorised
   with cumsum + searchsorted), so a seeded request gets the same tokens whatever else is in
   the batch.
5. Logprobs (when any row asks): log-softmax of the processed distribution of step 3, or for
   greedy rows of the logits at temperature 1; the sampled token's logprob and the top
   ``params.logprobs`` pairs.

Invariants:
- The logits passed in are never modified.
- Work on ``[N, V]`` tensors is batched; Python loops run over rows only to read parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from metrale_core.sampling.interface import RowLike, SampleOutput, SamplingError

__all__ = ["DefaultSampler", "inverse_cdf", "truncate"]


class DefaultSampler:
    """The built-in sampler (see the module docstring for the exact order of steps)."""

    def sample(self, logits: torch.Tensor, rows: Sequence[RowLike]) -> SampleOutput:
        """Pick one token per row of ``[N, V]`` ``logits``; ``rows[i]`` owns row ``i``."""
        _check_rows(logits, rows)
        greedy, sampled = _split(rows, logits.device)
        processed = None
        # max(...).indices is argmax (first maximum on ties) through a faster CPU kernel
        if not sampled.numel():  # every row greedy: no row gather
            token_ids = logits.max(dim=-1).indices
        else:
            token_ids = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
            if greedy.numel():
                token_ids[greedy] = logits.index_select(0, greedy).max(dim=-1).indices
        if sampled.numel():
            sampled_rows = [rows[i] for i in sampled.tolist()]
            processed = truncate(logits.index_select(0, sampled), sampled_rows)
            uniforms = _uniforms(sampled_rows, logits.device)
            token_ids[sampled] = inverse_cdf(torch.softmax(processed, dim=-1), uniforms)
        ids = token_ids.tolist()
        if not any(r.params.logprobs is not None for r in rows):
            return SampleOutput(token_ids=ids)
        logprobs = torch.empty_like(logits)
        if greedy.numel():
            logprobs[greedy] = torch.log_softmax(logits.index_select(0, greedy), dim=-1)
        if processed is not None:
            logprobs[sampled] = torch.log_softmax(processed, dim=-1)
        chosen = logprobs.gather(1, token_ids[:, None])[:, 0].tolist()
        return SampleOutput(token_ids=ids, logprobs=chosen, top_logprobs=_top(logprobs, rows))

    def process(self, logits: torch.Tensor, rows: Sequence[RowLike]) -> torch.Tensor:
        """Logits of the distribution :meth:`sample` draws from, removed tokens ``-inf``.

        Sampled rows: temperature, top-k, top-p and min-p applied.  Greedy rows are a point
        mass: the first maximal logit is kept, every other token is ``-inf``.
        """
        _check_rows(logits, rows)
        greedy, sampled = _split(rows, logits.device)
        out = torch.full_like(logits, float("-inf"))
        if greedy.numel():
            sub = logits.index_select(0, greedy)
            best = sub.argmax(dim=-1, keepdim=True)
            point = torch.full_like(sub, float("-inf")).scatter_(1, best, sub.gather(1, best))
            out[greedy] = point
        if sampled.numel():
            out[sampled] = truncate(logits.index_select(0, sampled), [rows[i] for i in sampled.tolist()])
        return out


def truncate(logits: torch.Tensor, rows: Sequence[RowLike]) -> torch.Tensor:
    """Temperature, top-k, top-p then min-p on ``[n, V]`` logits of non-greedy rows.

    Returns a new tensor whose removed tokens are ``-inf``; the input is not modified.
    """
    vocab = logits.shape[1]
    dev, dtype = logits.device, logits.dtype
    temperature = torch.tensor([r.params.temperature for r in rows], dtype=dtype, device=dev)
    if bool((temperature <= 0).any()):
        raise ValueError("truncate() is for non-greedy rows only (temperature > 0)")
    x = logits / temperature[:, None]
    top_k = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]
    top_p = [r.params.top_p for r in rows]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        x = _top_k_top_p(x, torch.tensor(top_k, device=dev), torch.tensor(top_p, dtype=dtype, device=dev))
    min_p = [r.params.min_p for r in rows]
    if any(m > 0.0 for m in min_p):
        probs = torch.softmax(x, dim=-1)
        floor = torch.tensor(min_p, dtype=dtype, device=dev)[:, None] * probs.amax(dim=-1, keepdim=True)
        x = x.masked_fill(probs < floor, float("-inf"))
    return x


def _top_k_top_p(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to ``-inf`` what top-k (``top_k[i] == V`` = off) then top-p (1.0 = off) remove."""
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(x.shape[1], device=x.device)[None, :]
    sorted_x = sorted_x.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(1, order, sorted_x)


def _split(rows: Sequence[RowLike], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch indices of greedy rows and of sampled rows."""
    is_greedy = torch.tensor([r.params.temperature == 0.0 for r in rows], dtype=torch.bool)
    greedy = is_greedy.nonzero()[:, 0].to(device)
    sampled = (~is_greedy).nonzero()[:, 0].to(device)
    return greedy, sampled


def _check_rows(logits: torch.Tensor, rows: Sequence[RowLike]) -> None:
    if logits.ndim != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"expected [N, V] logits with N = {len(rows)} rows, got {tuple(logits.shape)}")
    # One pass: a row's max is finite exactly when it has a token to sample and no NaN or +inf
    # (amax propagates NaN; -inf only where every logit is masked), so masked rows cost no more.
    bad = ~logits.amax(dim=-1).isfinite()
    if bool(bad.any()):
        raise SamplingError(
            f"logits rows {bad.nonzero()[:, 0].tolist()} have no token left to sample "
            "(every logit is -inf, or a logit is NaN or +inf); a logit processor masked "
            "everything or the model produced non-finite logits"
        )


def _uniforms(rows: Sequence[RowLike], device) -> torch.Tensor:
    """One uniform in [0, 1) per row, each from that row's own generator."""
    draws = []
    for r in rows:
        gen = r.generator
        draws.append(torch.rand(1, generator=gen, device=gen.device if gen is not None else "cpu"))
    return torch.cat([d.to(device) for d in draws])


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative probability exceeds ``u * total`` (``probs``
    ``[R, V]`` need not be normalised; ``uniforms`` ``[R]`` in ``[0, 1)``).  Public: a proposer
    drafting from its own distribution samples with it (``metrale_core.api.inverse_cdf``)."""
    cdf = probs.cumsum(dim=-1)
    target = (uniforms.to(cdf.dtype) * cdf[:, -1])[:, None]
    picked = torch.searchsorted(cdf, target, right=True)[:, 0]
    # Rounding can put the target at the very top of the CDF: stay on a token that has mass.
    rank = torch.arange(probs.shape[1], device=probs.device)
    last = torch.where(probs > 0, rank, torch.zeros_like(rank)).amax(dim=-1)
    return torch.minimum(picked, last)


def _top(logprobs: torch.Tensor, rows: Sequence[RowLike]) -> list[list[tuple[int, float]]]:
    """Per row, its ``params.logprobs`` most likely finite ``(token_id, logprob)`` pairs."""
    wanted = [r.params.logprobs or 0 for r in rows]
    width = min(max(wanted), logprobs.shape[1])
    if width == 0:
        return [[] for _ in rows]
    values, ids = logprobs.topk(width, dim=-1)
    value_rows, id_rows = values.tolist(), ids.tolist()
    return [
        [(t, v) for t, v in zip(id_rows[i][: wanted[i]], value_rows[i][: wanted[i]]) if v != float("-inf")]
        for i in range(len(rows))
    ]
