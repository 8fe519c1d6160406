"""DSA attention of GLM-5.3: NoPE MLA over a paged latent cache, with the k-pool indexer.

Owner: ``metrale_glm_kda``.  Cache layout (``KVLayout(num_kv_heads=1, head_dim=kv_lora_rank,
v_head_dim=2 * index_head_dim)``, one K/V pair per attention layer):
- ``k[layer]`` holds the normalised latent ``c = kv_a_layernorm(kv_a_proj(x))`` of every token;
- ``v[layer]`` holds the indexer's per-token cache ``[k_norm(wk(x)), x @ compress_gate^T]`` (written
  by layers with a full indexer; unused by shared-indexer layers).

Invariants:
- The cache is read and written only through ``PagedKVCache.write`` / ``gather`` (plain floats
  are gathered directly), so a quantizing KV codec (fp8) stores both the latent and the indexer
  rows; shared-indexer layers write zero indexer rows (never read).
- Every row's cache entries are written at ``slot_mapping`` before any row reads.
- Attention is absorbed MLA: ``q_lat = q_nope @ W_uk`` scores against the latents, the output is
  ``(probs @ c) @ W_uv^T``; scale ``qk_head_dim ** -0.5``; no rotary anywhere.
- A row at position ``p`` attends to the tokens of the complete k-pools its indexer selected
  (the top ``index_topk / index_kpool`` pools by index score among pools ending at or before
  ``p``) plus its incomplete tail pool — exactly transformers' ``Glm5NextTextIndexer``; with no
  more complete pools than that budget this is plain causal attention.
- A shared-indexer layer reuses the token selection of the latest full-indexer layer of the same
  forward (same sequences, same rows).
- Sequences feeding one row (decode) attend in one batch: gathered through their block tables to
  the longest context and masked by length; multi-row sequences attend one by one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attrs import frozen

from metrale_core.api import Linear, PagedKVCache, gather_blocks, rms_norm
from metrale_glm_kda.config import GlmDims

__all__ = ["DECODE", "IndexerWeights", "MlaWeights", "SeqRows", "mla_attention", "select_decode", "select_tokens"]

#: ``selection`` key of the batched decode rows' token mask ``[B, L]``.
DECODE = "decode"


@frozen
class IndexerWeights:
    wq_b: torch.Tensor  # [n_heads * d, q_lora_rank]
    wk: torch.Tensor  # [d, D]
    k_norm_weight: torch.Tensor  # [d]
    k_norm_bias: torch.Tensor  # [d]
    weights_proj: torch.Tensor  # [n_heads, D]
    ape: torch.Tensor  # [kpool, d]
    gate: torch.Tensor  # [d, D]


@frozen
class MlaWeights:
    q_a: Linear  # [Rq, D]
    q_a_norm: torch.Tensor  # [Rq]
    q_b: Linear  # [H * nope, Rq]
    kv_a: Linear  # [R, D]
    kv_a_norm: torch.Tensor  # [R]
    w_uk: torch.Tensor  # [H, nope, R]
    w_uv: torch.Tensor  # [H, v, R]
    o_proj: Linear  # [D, H * v]
    indexer: IndexerWeights | None


@frozen
class SeqRows:
    """One sequence of the batch: rows ``lo:hi`` at positions ``ctx - (hi - lo) .. ctx - 1``."""

    index: int
    lo: int
    hi: int
    ctx: int


def _gather(
    kv: PagedKVCache, layer: int, block_ids: torch.Tensor, dtype: torch.dtype, need_index: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Latents ``[..., nb * bs, R]`` and (when ``need_index``) indexer rows of ``block_ids``."""
    if kv.plain:
        c = gather_blocks(kv.k[layer], block_ids, dtype)
        v = gather_blocks(kv.v[layer], block_ids, dtype) if need_index else None
    else:
        c, v = kv.gather(layer, block_ids, dtype)
    return c.squeeze(-2), None if v is None else v.squeeze(-2)


def select_tokens(
    dims: GlmDims, w: IndexerWeights, q_resid: torch.Tensor, x: torch.Tensor, index_cache: torch.Tensor, ctx: int
) -> torch.Tensor | None:
    """Bool ``[n, ctx]`` tokens the ``n`` rows (the last ``n`` positions) may attend to, or None
    when every causal token is selectable (no more complete pools than the budget)."""
    kpool = dims.index_kpool
    budget = dims.index_topk // kpool
    pools = ctx // kpool
    if pools <= budget and dims.index_tail:
        return None
    n, d, heads = q_resid.shape[0], dims.index_head_dim, dims.index_n_heads
    device = x.device
    positions = torch.arange(ctx - n, ctx, device=device)
    keys, gates = index_cache[: pools * kpool].view(pools, kpool, 2 * d).split(d, dim=-1)
    probs = torch.softmax(gates.float() + w.ape.float(), dim=1).to(keys.dtype)
    pool_keys = (probs * keys).sum(dim=1)  # [P, d]
    q = F.linear(q_resid, w.wq_b).view(n, heads, d)
    scores = F.relu(torch.einsum("nhd,pd->nhp", q.float(), pool_keys.float()) * d**-0.5)
    head_w = F.linear(x, w.weights_proj).float() * heads**-0.5
    index_scores = torch.einsum("nh,nhp->np", head_w, scores)
    pool_end = torch.arange(1, pools + 1, device=device) * kpool - 1
    visible = pool_end[None, :] <= positions[:, None]  # [n, P]
    if pools > budget:
        top = index_scores.masked_fill(~visible, float("-inf")).topk(budget, dim=-1).indices
        chosen = torch.zeros_like(visible).scatter_(1, top, True) & visible
    else:
        chosen = visible
    tokens = torch.arange(ctx, device=device)
    in_pool = tokens < pools * kpool
    allowed = torch.zeros(n, ctx, dtype=torch.bool, device=device)
    allowed[:, in_pool] = chosen[:, tokens[in_pool] // kpool]
    if dims.index_tail:
        tail_start = positions + 1 - (positions + 1) % kpool
        allowed |= (tokens[None, :] >= tail_start[:, None]) & (tokens[None, :] <= positions[:, None])
    return allowed


def select_decode(
    dims: GlmDims,
    w: IndexerWeights,
    q_resid: torch.Tensor,
    x: torch.Tensor,
    index_cache: torch.Tensor,
    ctx: torch.Tensor,
    ctx_host: list[int],
) -> torch.Tensor:
    """:func:`select_tokens` for ``B`` decode rows at once (row ``b`` at position ``ctx[b] - 1``):
    bool ``[B, L]`` over the gathered ``index_cache`` ``[B, L, 2d]`` (``L >= max(ctx)``)."""
    kpool, budget = dims.index_kpool, dims.index_topk // dims.index_kpool
    rows, length = index_cache.shape[:2]
    device = x.device
    tokens = torch.arange(length, device=device)
    causal = tokens[None, :] < ctx[:, None]
    most = max(ctx_host) // kpool
    if most == 0 or (most <= budget and dims.index_tail):
        return causal
    d, heads = dims.index_head_dim, dims.index_n_heads
    keys, gates = index_cache[:, : most * kpool].reshape(rows, most, kpool, 2 * d).split(d, dim=-1)
    probs = torch.softmax(gates.float() + w.ape.float(), dim=2).to(keys.dtype)
    pool_keys = (probs * keys).sum(dim=2)  # [B, P, d]
    q = F.linear(q_resid, w.wq_b).view(rows, heads, d)
    scores = F.relu(torch.einsum("bhd,bpd->bhp", q.float(), pool_keys.float()) * d**-0.5)
    head_w = F.linear(x, w.weights_proj).float() * heads**-0.5
    index_scores = torch.einsum("bh,bhp->bp", head_w, scores)
    pools = ctx // kpool
    visible = torch.arange(most, device=device)[None, :] < pools[:, None]  # pool end <= position
    if most > budget:
        top = index_scores.masked_fill(~visible, float("-inf")).topk(budget, dim=-1).indices
        chosen = torch.zeros_like(visible).scatter_(1, top, True) & visible
    else:
        chosen = visible
    pool_of = (tokens // kpool).clamp(max=most - 1).expand(rows, length)
    in_pool = tokens[None, :] < (pools * kpool)[:, None]
    allowed = chosen.gather(1, pool_of) & in_pool
    if dims.index_tail:
        allowed |= ~in_pool & causal
    return allowed


def _decode_attention(
    dims: GlmDims,
    w: MlaWeights,
    kv: PagedKVCache,
    layer: int,
    q_lat: torch.Tensor,
    q_resid: torch.Tensor,
    x: torch.Tensor,
    block_tables: torch.Tensor,
    dec: list[SeqRows],
    selection: dict,
    out_lat: torch.Tensor,
) -> None:
    """Batched attention of the single-row sequences ``dec`` into ``out_lat``."""
    device = x.device
    ctx_host = [s.ctx for s in dec]
    longest = max(ctx_host)
    blocks = -(-longest // kv.block_size)
    index = torch.tensor([s.index for s in dec], dtype=torch.int64, device=device)
    rows = torch.tensor([s.lo for s in dec], dtype=torch.int64, device=device)
    ctx = torch.tensor(ctx_host, dtype=torch.int64, device=device)
    ix = w.indexer
    c, icache = _gather(kv, layer, block_tables[index, :blocks], q_lat.dtype, ix is not None)
    c = c[:, :longest]
    if ix is not None:
        assert icache is not None  # gathered whenever the layer has an indexer
        selection[DECODE] = select_decode(dims, ix, q_resid[rows], x[rows], icache[:, :longest], ctx, ctx_host)
    allowed = selection[DECODE]
    scores = torch.einsum("bhr,blr->bhl", q_lat[rows], c)
    probs = torch.softmax(scores.float().masked_fill(~allowed[:, None, :], float("-inf")), dim=-1)
    out_lat[rows] = torch.einsum("bhl,blr->bhr", probs.to(c.dtype), c)


def mla_attention(
    dims: GlmDims,
    w: MlaWeights,
    x: torch.Tensor,
    kv: PagedKVCache,
    layer: int,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    one_row: list[SeqRows],
    multi: list[SeqRows],
    selection: dict,
) -> torch.Tensor:
    """One DSA layer (KV layer ``layer``) over the flat rows ``x`` ``[T, D]``; returns ``[T, D]``.

    ``one_row`` / ``multi``: the sequences feeding one row (attended in one batched call) and
    those feeding several, as ``ForwardBatch.split`` carries them.

    ``selection`` maps sequence index (or :data:`DECODE` for the batched decode rows) -> token
    mask; a full-indexer layer fills it, a shared one reads it.
    """
    rows = x.shape[0]
    heads, nope = dims.num_heads, dims.qk_nope_head_dim
    eps = dims.rms_norm_eps
    q_resid = rms_norm(w.q_a(x), w.q_a_norm, eps)
    q = w.q_b(q_resid).view(rows, heads, nope)
    q_lat = torch.einsum("thn,hnr->thr", q, w.w_uk) * nope**-0.5  # [T, H, R]
    latent = rms_norm(w.kv_a(x), w.kv_a_norm, eps)
    ix = w.indexer
    if ix is not None:
        ik = F.layer_norm(F.linear(x, ix.wk), (dims.index_head_dim,), ix.k_norm_weight, ix.k_norm_bias, 1e-6)
        index_rows = torch.cat([ik, F.linear(x, ix.gate)], -1)
    else:
        index_rows = latent.new_zeros(rows, dims.indexer_cache_dim)
    kv.write(layer, slot_mapping, latent.unsqueeze(1), index_rows.unsqueeze(1))
    out_lat = torch.empty_like(q_lat)
    if one_row:
        _decode_attention(dims, w, kv, layer, q_lat, q_resid, x, block_tables, one_row, selection, out_lat)
    for seq in multi:
        n = seq.hi - seq.lo
        blocks = -(-seq.ctx // kv.block_size)
        c, icache = _gather(kv, layer, block_tables[seq.index, :blocks], q_lat.dtype, ix is not None)
        c = c[: seq.ctx]  # [ctx, R]
        if ix is not None:
            assert icache is not None  # gathered whenever the layer has an indexer
            selection[seq.index] = select_tokens(
                dims, ix, q_resid[seq.lo : seq.hi], x[seq.lo : seq.hi], icache[: seq.ctx], seq.ctx
            )
        allowed = selection[seq.index]
        if allowed is None:
            positions = torch.arange(seq.ctx - n, seq.ctx, device=x.device)
            allowed = torch.arange(seq.ctx, device=x.device)[None, :] <= positions[:, None]
        scores = torch.einsum("nhr,cr->nhc", q_lat[seq.lo : seq.hi], c)
        probs = torch.softmax(scores.float().masked_fill(~allowed[:, None, :], float("-inf")), dim=-1)
        out_lat[seq.lo : seq.hi] = torch.einsum("nhc,cr->nhr", probs.to(c.dtype), c)
    o = torch.einsum("thr,hvr->thv", out_lat, w.w_uv).reshape(rows, -1)
    return w.o_proj(o)
