"""Paged attention in torch: the CPU path and the oracle of the decode kernel.

Owner: ``metrale_core.layers``.  :class:`AttentionPlan` is built once per forward from the batch's
carried split (``ForwardBatch.split``, made once by the scheduler's plan) and host-side context
lengths, and shared by every layer.

Invariants:
- K/V of every row are written at ``slot_mapping`` before any row attends, through the cache's
  codec (``PagedKVCache.write`` / ``gather``): plain storage goes through the raw-cache kernels
  unchanged; any other codec (FP8) is read through its fused decode kernel or ``gather``.
- Each row at absolute position ``p`` attends to cached positions ``0..p`` of its own sequence,
  read through that sequence's block table (padding entries beyond the context are never used).
- Decode rows (sequences feeding exactly one row) are attended in one batched call with no
  per-sequence Python loop; multi-row sequences (prefill chunks, verify rows) are attended one
  sequence at a time.  Which rows are which comes from ``batch.split``; the plan never
  classifies ``query_lens_host`` itself.
- On CPU the decode rows of a plain cache read it through a :class:`DecodeGather` built once per
  forward (flat cache slots ``[B, L]`` and the context mask), so each layer costs two
  ``index_select`` and one ``scaled_dot_product_attention``; on CUDA the decode kernel reads the
  block tables itself and ``decode_attention`` below is its oracle.
- GQA: KV head ``j`` serves query heads ``[j*G, (j+1)*G)``; softmax runs in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from attrs import frozen

from metrale_core.model_api import ForwardBatch, PagedKVCache

__all__ = [
    "AttentionPlan",
    "DecodeGather",
    "attend_decode",
    "attend_decode_gathered",
    "attend_masked",
    "attend_prefill",
    "decode_attention",
    "paged_attention",
    "prefill_attention",
    "write_kv",
]


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store ``k``/``v`` ``[T, Hk, d]`` at flat slots ``[T]`` of ``[blocks, bs, Hk, d]`` caches."""
    hk, d = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, hk, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, hk, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _gather(cache: torch.Tensor, tables: torch.Tensor, num_blocks: int, dtype: torch.dtype) -> torch.Tensor:
    """``[..., num_blocks * bs, Hk, d]`` view of the first ``num_blocks`` blocks of ``tables``."""
    gathered = cache[tables[..., :num_blocks]]  # [..., nb, bs, Hk, d]
    shape = (*gathered.shape[:-4], -1, *gathered.shape[-2:])
    return gathered.reshape(shape).to(dtype)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_context: int,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """One query row per sequence: ``q`` ``[B, Hq, d]`` -> ``[B, Hq, d]``, batched over B
    (``window`` / ``sinks`` / ``softcap``: :func:`attend_decode`'s; every block up to the context
    is read)."""
    num_blocks = -(-max_context // k_cache.shape[1])
    k = _gather(k_cache, block_tables, num_blocks, torch.float32)  # [B, L, Hk, d]
    v = _gather(v_cache, block_tables, num_blocks, torch.float32)
    return attend_decode(q, k, v, context_lens, scale, window, sinks, softcap)


def attend_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """``q`` ``[B, Hq, d]`` over gathered float32 ``k``/``v`` ``[B, L, Hk, d]`` (``L`` >= context);
    ``window``: only the last ``window`` positions of each context; ``sinks`` ``[Hq]``: a sink
    logit in each head's softmax, with no value; ``softcap``: scores capped at
    ``softcap * tanh(score / softcap)`` (``window_attention``'s definitions)."""
    bsz, hq, d = q.shape
    hk = k.shape[2]
    q4 = q.float().view(bsz, hk, hq // hk, d)
    scores = torch.einsum("bhgd,blhd->bhgl", q4, k) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    pos = torch.arange(k.shape[1], device=q.device)[None, :]
    pad = pos >= context_lens[:, None]  # [B, L]
    if window is not None:
        pad |= pos < context_lens[:, None] - window
    scores.masked_fill_(pad[:, None, None, :], float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.float().view(1, hk, hq // hk, 1).expand(bsz, -1, -1, 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("bhgl,blhd->bhgd", probs, v)
    return out.reshape(bsz, hq, d).to(q.dtype)


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_len: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows ``q`` ``[n, Hq, d]`` of one sequence, the last ``n`` of its ``context_len`` positions
    (``window`` / ``softcap`` / ``sinks``: as :func:`attend_prefill`)."""
    num_blocks = -(-context_len // k_cache.shape[1])
    k = _gather(k_cache, block_table, num_blocks, q.dtype)
    v = _gather(v_cache, block_table, num_blocks, q.dtype)
    return attend_prefill(q, k, v, context_len, scale, window, softcap, sinks)


def attend_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_len: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal rows ``q`` ``[n, Hq, d]`` over gathered ``k``/``v`` ``[>= context_len, Hk, d]``; with
    a ``window`` the row at position ``p`` sees only ``p - window + 1 .. p``; ``softcap`` /
    ``sinks`` as :func:`attend_masked`."""
    n = q.shape[0]
    k, v = k[:context_len], v[:context_len]  # [c, Hk, d]
    rows = torch.arange(context_len - n, context_len, device=q.device)
    keys = torch.arange(context_len, device=q.device)
    allowed = keys[None, :] <= rows[:, None]  # [n, c] causal over prefix + this chunk
    if window is not None:
        allowed &= keys[None, :] > rows[:, None] - window
    if softcap is not None or sinks is not None:
        heads = (q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0))
        return attend_masked(*heads, allowed[None, None], scale, softcap, sinks)[0].transpose(0, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=allowed,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


def attend_masked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``q`` ``[B, Hq, n, d]`` over ``k``/``v`` ``[B, Hk, L, d]`` where bool ``mask`` ``[B, 1, n, L]``
    (GQA: KV head ``j`` serves query heads ``[j*G, (j+1)*G)``); returns ``[B, Hq, n, d]``.
    ``sinks`` ``[Hq]``: a sink logit in each head's softmax (``window_attention``'s docstring)."""
    bsz, hq, n, d = q.shape
    hk = k.shape[1]
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    q5 = q.float().view(bsz, hk, hq // hk, n, d)
    scores = torch.einsum("bhgnd,bhld->bhgnl", q5, k.float()) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores.masked_fill_(~mask[:, :, None], float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.float().view(1, hk, hq // hk, 1, 1).expand(bsz, -1, -1, n, 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("bhgnl,bhld->bhgnd", probs, v.float())
    return out.reshape(bsz, hq, n, d).to(q.dtype)


@frozen
class DecodeGather:
    """Where the decode rows' context lives in a plain cache, computed once per forward."""

    #: ``[B * L]`` flat cache slots of positions ``0..L-1`` of every decode row's sequence
    #: (positions past a sequence's context point at block-table padding and are masked).
    slots: torch.Tensor
    #: ``[B, 1, 1, L]`` bool, True where the position is inside the sequence's context.
    mask: torch.Tensor
    #: ``L``: the longest context among the decode rows.
    length: int

    @classmethod
    def build(cls, tables: torch.Tensor, context: torch.Tensor, max_context: int, block_size: int) -> DecodeGather:
        pos = torch.arange(max_context, device=tables.device)
        slots = tables[:, pos // block_size] * block_size + pos % block_size  # [B, L]
        mask = (pos[None, :] < context[:, None])[:, None, None, :]
        return cls(slots.reshape(-1), mask, max_context)


def attend_decode_gathered(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, gather: DecodeGather, scale: float
) -> torch.Tensor:
    """``q`` ``[B, Hq, d]`` over plain ``[blocks, bs, Hk, d]`` caches read at ``gather.slots``."""
    hk, d = k_cache.shape[2], k_cache.shape[3]
    shape = (q.shape[0], gather.length, hk, d)
    k = k_cache.view(-1, hk, d).index_select(0, gather.slots).view(shape)
    v = v_cache.view(-1, hk, d).index_select(0, gather.slots).view(shape)
    return _attend_masked(q, k.to(q.dtype), v.to(q.dtype), gather.mask, scale)


def _attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``q`` ``[B, Hq, d]`` over ``k``/``v`` ``[B, L, Hk, d]`` where ``mask`` ``[B, 1, 1, L]``.
    The G query heads of a KV head attend as G rows of one "sequence" (no K/V expansion)."""
    bsz, hq, d = q.shape
    hk = k.shape[2]
    out = F.scaled_dot_product_attention(
        q.view(bsz, hk, hq // hk, d), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
    )
    return out.reshape(bsz, hq, d)


@frozen
class AttentionPlan:
    """How the rows of one batch are attended; built once per forward, used by every layer."""

    #: Softmax scale (``head_dim ** -0.5``).
    scale: float
    #: Every sequence feeds one row, in sequence order (the whole batch is one decode call).
    pure_decode: bool
    #: ``[Bd]`` row indices of the decode rows (None when there are none).
    decode_rows: torch.Tensor | None
    #: ``[Bd, max_blocks]`` block tables and ``[Bd]`` context lengths of those rows' sequences.
    decode_tables: torch.Tensor | None
    decode_context: torch.Tensor | None
    #: Host-side maximum of ``decode_context``.
    decode_max_context: int
    #: ``(row_start, row_end, sequence_index, context_len)`` of each multi-row sequence.
    multi_row: tuple[tuple[int, int, int, int], ...]
    #: ``[B, max_blocks]`` block tables of the batch.
    block_tables: torch.Tensor
    #: The decode rows' cache slots and mask (CPU torch path only; None on CUDA, on the C path or
    #: without decode rows).
    decode_gather: DecodeGather | None = None

    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(decode_tables, decode_context)`` of a plan with decode rows (a caller bug otherwise)."""
        tables, context = self.decode_tables, self.decode_context
        assert tables is not None and context is not None, "the plan has no decode rows"
        return tables, context

    @classmethod
    def from_batch(cls, batch: ForwardBatch, scale: float, gather: bool = True) -> AttentionPlan:
        """``gather``: build the CPU ``decode_gather`` (only the torch decode path reads it)."""
        split, clens = batch.split, batch.context_lens_host
        cpu = gather and batch.input_ids.device.type == "cpu"
        if split.is_pure_decode:
            max_context = max(clens, default=0)
            decode_gather = (
                DecodeGather.build(batch.block_tables, batch.context_lens, max_context, batch.block_size)
                if cpu and clens
                else None
            )
            return cls(
                scale,
                True,
                None,
                batch.block_tables,
                batch.context_lens,
                max_context,
                (),
                batch.block_tables,
                decode_gather,
            )
        multi = tuple((start, end, i, clens[i]) for start, end, i in split.multi_row)
        device = batch.input_ids.device
        if split.one_row_seqs:
            seqs = torch.tensor(split.one_row_seqs, dtype=torch.int64, device=device)
            tables, context = batch.block_tables[seqs], batch.context_lens[seqs]
            max_context = max(clens[i] for i in split.one_row_seqs)
            decode_gather = DecodeGather.build(tables, context, max_context, batch.block_size) if cpu else None
            return cls(
                scale,
                False,
                torch.tensor(split.one_row_rows, dtype=torch.int64, device=device),
                tables,
                context,
                max_context,
                multi,
                batch.block_tables,
                decode_gather,
            )
        return cls(scale, False, None, None, None, 0, multi, batch.block_tables)


def _decode(q: torch.Tensor, kv: PagedKVCache, layer: int, plan: AttentionPlan, decode_op) -> torch.Tensor:
    """The decode rows ``q`` through the plain kernel, the codec's fused kernel, or a gather.
    A codec without a fused kernel (FP8 before its scales freeze) is attended with the same maths
    as a plain cache on every path, so its rows read back as a plain cache's would."""
    tables, context = plan.decode_inputs()
    args = (tables, context, plan.scale, plan.decode_max_context)
    if kv.plain:
        if plan.decode_gather is not None and decode_op.path == "native":
            return attend_decode_gathered(q, kv.k[layer], kv.v[layer], plan.decode_gather, plan.scale)
        return decode_op(q, kv.k[layer], kv.v[layer], *args)
    fused = kv.codec.decode_attention(kv, layer, q, *args)
    if fused is not None:
        return fused
    num_blocks = -(-plan.decode_max_context // kv.block_size)
    if decode_op.path == "cpu":  # the plain cache's C kernel over the decoded rows: same maths
        k, v = kv.gather(layer, tables[:, :num_blocks], q.dtype)  # one block per row
        rows = torch.arange(q.shape[0], device=q.device).unsqueeze(1)
        return decode_op(q, k, v, rows, context, plan.scale, plan.decode_max_context)
    if plan.decode_gather is not None:  # same maths as the plain CPU path, over decoded rows
        length = plan.decode_gather.length
        k, v = kv.gather(layer, tables[:, :num_blocks], q.dtype)
        return _attend_masked(q, k[:, :length], v[:, :length], plan.decode_gather.mask, plan.scale)
    k, v = kv.gather(layer, tables[:, :num_blocks], torch.float32)
    return attend_decode(q, k, v, context, plan.scale)


def paged_attention(
    q: torch.Tensor, kv: PagedKVCache, layer: int, plan: AttentionPlan, decode_op, prefill_op=None
) -> torch.Tensor:
    """Attend every row of ``q`` ``[T, Hq, d]`` over ``layer`` of ``kv``; ``decode_op`` is the
    batched decode kernel op over plain caches, ``prefill_op`` (CPU models) the one for the
    multi-row segments over plain caches."""
    if plan.pure_decode:
        return _decode(q, kv, layer, plan, decode_op)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if plan.decode_rows is not None:
        out[plan.decode_rows] = _decode(q[plan.decode_rows], kv, layer, plan, decode_op)
    if kv.plain and prefill_op is not None and prefill_op.path == "cpu":
        prefill_op(out, q, kv.k[layer], kv.v[layer], plan.block_tables, plan.multi_row, plan.scale)
        return out
    codec_prefill = getattr(kv.codec, "prefill_attention", None)  # a codec's own kernel (q8_0)
    if codec_prefill is not None:
        codec_prefill(kv, layer, out, q, plan.block_tables, plan.multi_row, plan.scale)
        return out
    for start, end, seq, context_len in plan.multi_row:
        num_blocks = -(-context_len // kv.block_size)
        k, v = kv.gather(layer, plan.block_tables[seq, :num_blocks], q.dtype)
        out[start:end] = attend_prefill(q[start:end], k, v, context_len, plan.scale)
    return out
