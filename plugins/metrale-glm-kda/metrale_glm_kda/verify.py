"""Speculative verify for the KDA layers: consume a verify chunk, then roll back to the kept rows.

Owner: ``metrale_glm_kda``.  ``GlmKdaLM.forward`` routes every sequence with
``ForwardBatch.verify_host[i]`` through :func:`consume_verify_chunk` (one call per KDA layer);
``GlmKdaLM.commit_verify`` calls :func:`rollback` (checkpoint + replay, like the Rust KDA engine).

Invariants:
- A verify chunk ``[last, d1..dk]`` always runs the recurrent form (token by token) over that
  one sequence, whatever its length, and its slot's state before the chunk plus the chunk's
  recurrence inputs are recorded in ``pool.verify`` (:class:`~metrale_glm_kda.state.VerifyLog`).
- ``rollback(..., num_kept=m)`` restores the checkpoint and replays rows ``0..m-1`` with the same
  functions on the same per-step shapes, so the slot ends *bit for bit* as if only those rows
  had been fed: the conv window is a copy of the last ``kernel - 1`` raw inputs, and each step
  of ``kda_recurrent`` depends only on the state and that row.  ``m == rows`` changes nothing.
- The log is consumed by ``rollback`` (and dropped by the next forward); a slot missing from it
  is an engine bug and raises.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from metrale_glm_kda import kda
from metrale_glm_kda.state import KdaStatePool, VerifyLog, VerifyRecord

__all__ = ["consume_verify_chunk", "rollback"]


def consume_verify_chunk(
    pool: KdaStatePool,
    layer: int,
    slot: int,
    raw: torch.Tensor,
    conv_weight: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Feed one verify chunk (``raw`` ``[n, 3*H*K]`` pre-conv projections, ``g`` ``[n, H, K]``,
    ``beta`` ``[n, H]``) to KDA layer ``layer`` of ``slot``; records it and returns the core
    output ``[n, H, V]`` float32."""
    rec, conv = pool.recurrent[layer], pool.conv[layer]
    n = raw.shape[0]
    before_rec, before_conv = rec[slot].clone(), conv[slot].clone()
    mixed, conv[slot] = kda.conv_prefill(raw, conv[slot], conv_weight)
    q, k, v = mixed.view(n, 3, heads, head_dim).unbind(1)
    q, k = kda.prepare_qk(q, k)
    q, k, v = q[:, None], k[:, None], v[:, None]
    g, beta = g[:, None], beta[:, None]
    out, final = kda.kda_recurrent(q, k, v, g, beta, before_rec[None])
    rec[slot] = final[0]
    log = pool.verify if pool.verify is not None else VerifyLog()
    pool.verify = log
    log.rows[slot] = n
    log.records.setdefault(slot, {})[layer] = VerifyRecord(
        rec=before_rec, conv=before_conv, raw=raw.clone(), q=q, k=k, v=v, g=g, beta=beta
    )
    return out[:, 0]


def rollback(pool: KdaStatePool, conv_weights: Seq[torch.Tensor], slots: Seq[int], num_kept: Seq[int]) -> None:
    """Leave each ``slots[j]`` as if only the first ``num_kept[j]`` rows of its verify chunk had
    been consumed; ``conv_weights[layer]`` is each KDA layer's conv weight."""
    log = pool.verify
    pool.verify = None
    if not slots:
        return
    if log is None:
        raise RuntimeError("commit_verify called, but the last forward fed no verify chunk")
    for slot, keep in zip(slots, num_kept):
        slot, keep = int(slot), int(keep)
        rows = log.rows.get(slot)
        if rows is None:
            raise RuntimeError(f"commit_verify: state slot {slot} fed no verify chunk in the last forward")
        if not 1 <= keep <= rows:
            raise ValueError(f"commit_verify: slot {slot} keeps {keep} rows of a {rows}-row verify chunk")
        if keep == rows:
            continue
        for layer, r in log.records[slot].items():
            _, pool.conv[layer][slot] = kda.conv_prefill(r.raw[:keep], r.conv, conv_weights[layer])
            _, final = kda.kda_recurrent(r.q[:keep], r.k[:keep], r.v[:keep], r.g[:keep], r.beta[:keep], r.rec[None])
            pool.recurrent[layer][slot] = final[0]
