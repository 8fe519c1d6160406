"""Repetition, presence and frequency penalties and ``logit_bias``, vectorised over a batch.

Owner: the logit pipeline calls :func:`apply_penalties_and_bias` after the plugin processors and
before the sampler.

Semantics, applied in this order to each row's logits:
1. repetition penalty ``r`` (HF / vLLM): for every token in prompt + output, a logit ``> 0`` is
   divided by ``r``, any other logit is multiplied by ``r``;
2. presence penalty (OpenAI): ``presence`` is subtracted from every token that occurs in the output;
3. frequency penalty (OpenAI): ``frequency * count`` is subtracted, ``count`` = occurrences in the
   output;
4. ``logit_bias``: each ``(token_id, bias)`` pair is added to that token's logit.

Invariants:
- The input tensor is never modified; when no row has a penalty or bias, it is returned as is.
- Work is done with scatters over padded ``[n, L]`` token-id tensors of the affected rows only;
  nothing loops over the vocabulary in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from metrale_core.errors import InvalidRequest
from metrale_core.sampling.interface import RowLike

__all__ = ["apply_penalties_and_bias"]


def apply_penalties_and_bias(logits: torch.Tensor, rows: Sequence[RowLike]) -> torch.Tensor:
    """Return ``[N, V]`` logits with every row's penalties and bias applied (see module doc)."""
    rep = [i for i, r in enumerate(rows) if _needs_repetition(r)]
    occ = [i for i, r in enumerate(rows) if _needs_occurrence(r)]
    bias = [i for i, r in enumerate(rows) if _needs_bias(r)]
    if not (rep or occ or bias):
        return logits
    out = logits.clone()
    if rep:
        _update_rows(out, rep, lambda sub, sel: _repetition(sub, [rows[i] for i in sel]))
    if occ:
        _update_rows(out, occ, lambda sub, sel: _occurrence(sub, [rows[i] for i in sel]))
    if bias:
        _update_rows(out, bias, lambda sub, sel: _bias(sub, [rows[i] for i in sel]))
    return out


def _needs_repetition(row: RowLike) -> bool:
    return row.params.repetition_penalty != 1.0


def _needs_occurrence(row: RowLike) -> bool:
    p = row.params
    return bool(row.output_ids) and (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0)


def _needs_bias(row: RowLike) -> bool:
    return bool(row.params.logit_bias)


def _update_rows(out: torch.Tensor, selected: list[int], fn) -> None:
    """Replace rows ``selected`` of ``out`` with ``fn(those rows, selected)``."""
    if len(selected) == out.shape[0]:
        out.copy_(fn(out, selected))
        return
    idx = torch.tensor(selected, dtype=torch.long, device=out.device)
    out.index_copy_(0, idx, fn(out.index_select(0, idx), selected))


def _padded(seqs: Sequence[Sequence[float]], pad: float, device, dtype=torch.long) -> torch.Tensor:
    """``[len(seqs), max_len]`` tensor of ``seqs``, right-padded with ``pad`` (at least one column)."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    width = max(int(lengths.max()), 1)
    flat = torch.tensor([t for s in seqs for t in s], dtype=dtype)
    padded = torch.full((len(seqs), width), pad, dtype=dtype)
    padded[torch.arange(width)[None, :] < lengths[:, None]] = flat
    return padded.to(device)


def _row_values(rows: Sequence[RowLike], name: str, like: torch.Tensor) -> torch.Tensor:
    """``[n, 1]`` column of ``row.params.<name>`` in ``like``'s dtype and device."""
    values = [float(getattr(r.params, name)) for r in rows]
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]


def _repetition(sub: torch.Tensor, rows: Sequence[RowLike]) -> torch.Tensor:
    vocab = sub.shape[1]
    ids = _padded([[*r.prompt_ids, *r.output_ids] for r in rows], vocab, sub.device)
    seen = torch.zeros(sub.shape[0], vocab + 1, dtype=torch.bool, device=sub.device)
    seen.scatter_(1, ids, True)
    penalty = _row_values(rows, "repetition_penalty", sub)
    penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
    return torch.where(seen[:, :vocab], penalised, sub)


def _occurrence(sub: torch.Tensor, rows: Sequence[RowLike]) -> torch.Tensor:
    vocab = sub.shape[1]
    ids = _padded([r.output_ids for r in rows], vocab, sub.device)
    counts = torch.zeros(sub.shape[0], vocab + 1, dtype=sub.dtype, device=sub.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=sub.dtype))
    counts = counts[:, :vocab]
    presence = _row_values(rows, "presence_penalty", sub)
    frequency = _row_values(rows, "frequency_penalty", sub)
    return sub - presence * (counts > 0).to(sub.dtype) - frequency * counts


def _bias(sub: torch.Tensor, rows: Sequence[RowLike]) -> torch.Tensor:
    vocab = sub.shape[1]
    for r in rows:
        for token_id, _ in r.params.logit_bias:
            if not 0 <= token_id < vocab:
                raise InvalidRequest(
                    f"logit_bias names token id {token_id}, outside the model's vocabulary "
                    f"[0, {vocab}); remove it from the request"
                )
    ids = _padded([[t for t, _ in r.params.logit_bias] for r in rows], vocab, sub.device)
    values = _padded([[b for _, b in r.params.logit_bias] for r in rows], 0.0, sub.device, dtype=sub.dtype)
    table = torch.zeros(sub.shape[0], vocab + 1, dtype=sub.dtype, device=sub.device)
    table.scatter_add_(1, ids, values)
    return sub + table[:, :vocab]
