"""Paged attention with a sliding window, logit soft-capping and/or attention sinks (torch path;
decode rows through the C decode kernel where it takes them).

Owner: ``metrale_core.layers``.  Models call :func:`windowed_paged_attention` for the layers that
declare a window (Gemma 2/3 "sliding_attention" layers, Mistral-style models), a soft-cap or
sinks (gpt-oss, windowed or not); the other layers keep
:func:`metrale_core.layers.attention.paged_attention` and its kernels.

Invariants:
- A row at absolute position ``p`` of a layer with window ``w`` attends to the cached positions
  ``max(0, p - w + 1) .. p`` of its own sequence (HF ``kv_idx > q_idx - sliding_window``,
  llama.cpp ``p1 - p0 < n_swa``); ``window=None`` is plain causal attention.
- Only the blocks that hold a position some row of the batch can still see are read (a decode
  row reads ``ceil(w / block_size) + 1`` blocks at most), so blocks that slid out of every
  window are never touched: the block manager may recycle them.
- The torch path reads K/V through ``PagedKVCache.gather`` (every codec, FP8 included); softmax
  runs in float32; soft-capping is ``cap * tanh(scores / cap)`` before the mask (Gemma 2).
- Sinks (``[Hq]`` logits, gpt-oss): each query head's softmax runs over its visible scores and
  its sink logit, and the sink's probability is dropped (no value): ``out = sum_l p_l v_l`` with
  ``p = softmax([scores, sink])[:-1]``, transformers' ``eager_attention_forward``.  With sinks
  every row is attended on its own -- a decode row reads only its own blocks -- so a row's result
  is the same bits alone and in any batch.
- The same :class:`~metrale_core.layers.attention.AttentionPlan` as ``paged_attention`` drives
  it, so a layer's choice between the two costs nothing per step.
- On CPU, over a plain cache, the decode rows go through the model's decode op's C kernel where
  it takes them (``PagedAttentionDecode.cpu_takes``) and the multi-row segments through the tiled
  prefill kernel (``PagedAttentionPrefill``): window, soft-cap and sinks in the kernels, the same
  positions read (none before a row's window), batch-invariant.  A codec whose own kernels take
  windows (``attends_windows``: q8_0's C kernels, which read the codes and scales in the dot
  products) attends both kinds of rows there, with the bits the float32 kernels give over the
  dequantized cache; everything else (other codecs, CUDA, inputs those kernels do not take) stays
  on the torch path here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from metrale_core.layers.attention import AttentionPlan, attend_masked
from metrale_core.model_api import PagedKVCache

if TYPE_CHECKING:
    from metrale_core.layers.ops import PagedAttentionDecode, PagedAttentionPrefill

__all__ = ["windowed_paged_attention"]


def _window_codec(kv: PagedKVCache) -> Any:
    """``kv``'s codec where its own ``decode_attention`` / ``prefill_attention`` take ``window`` /
    ``sinks`` / ``softcap`` (``attends_windows``: q8_0), else None."""
    return kv.codec if getattr(kv.codec, "attends_windows", False) else None


def _decode(
    q: torch.Tensor,
    kv: PagedKVCache,
    layer: int,
    tables: torch.Tensor,
    context: torch.Tensor,
    max_context: int,
    window: int | None,
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None = None,
    decode_op: PagedAttentionDecode | None = None,
) -> torch.Tensor:
    """Decode rows ``q`` ``[B, Hq, d]``: row ``b`` sits at position ``context[b] - 1``.  Through
    ``decode_op``'s C kernel where it takes them (CPU, plain cache: it reads only the window's
    positions and is batch-invariant); else with ``sinks`` each row on its own (one
    segment of one row: batch-invariant), without them one masked batch."""
    if decode_op is not None and kv.plain and decode_op.cpu_takes(q, kv.k[layer], kv.v[layer], tables, context):
        return decode_op(q, kv.k[layer], kv.v[layer], tables, context, scale, max_context, window, sinks, softcap)
    codec = _window_codec(kv)
    if codec is not None:  # the codec's own C kernel (q8_0), where it takes the rows
        fused = codec.decode_attention(kv, layer, q, tables, context, scale, max_context, window, sinks, softcap)
        if fused is not None:
            return fused
    if sinks is not None:
        rows = [
            _segment(q[b : b + 1], kv, layer, tables[b], int(c), window, scale, softcap, sinks)
            for b, c in enumerate(context.tolist())
        ]
        return torch.cat(rows) if rows else q.new_empty(q.shape)
    bs = kv.block_size
    if window is None:
        span, lo = max_context, torch.zeros_like(context)
    else:
        span, lo = min(window, max_context), (context - window).clamp(min=0)
    first_block = lo // bs  # [B]
    nb = -(-span // bs) + 1
    cols = (first_block[:, None] + torch.arange(nb, device=q.device)[None, :]).clamp(max=tables.shape[1] - 1)
    k, v = kv.gather(layer, tables.gather(1, cols), q.dtype)  # [B, nb * bs, Hk, d]
    pos = first_block[:, None] * bs + torch.arange(nb * bs, device=q.device)[None, :]  # [B, nb * bs]
    visible = (pos < context[:, None]) & (pos >= lo[:, None])
    out = attend_masked(q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), visible[:, None, None, :], scale, softcap)
    return out.squeeze(2)


def _segment(
    q: torch.Tensor,
    kv: PagedKVCache,
    layer: int,
    table: torch.Tensor,
    context_len: int,
    window: int | None,
    scale: float,
    softcap: float | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows ``q`` ``[n, Hq, d]`` of one sequence, the last ``n`` of its ``context_len`` positions."""
    n, bs = q.shape[0], kv.block_size
    first = context_len - n
    lo = 0 if window is None else max(0, first - window + 1)
    b0 = lo // bs
    k, v = kv.gather(layer, table[b0 : -(-context_len // bs)], q.dtype)  # [(nb - b0) * bs, Hk, d]
    keys = torch.arange(b0 * bs, b0 * bs + k.shape[0], device=q.device)
    rows = torch.arange(first, context_len, device=q.device)
    allowed = keys[None, :] <= rows[:, None]
    if window is not None:
        allowed &= keys[None, :] > rows[:, None] - window
    out = attend_masked(
        q.transpose(0, 1).unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        allowed[None, None],
        scale,
        softcap,
        sinks,
    )
    return out[0].transpose(0, 1)


def windowed_paged_attention(
    q: torch.Tensor,
    kv: PagedKVCache,
    layer: int,
    plan: AttentionPlan,
    *,
    window: int | None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    decode_op: PagedAttentionDecode | None = None,
    prefill_op: PagedAttentionPrefill | None = None,
) -> torch.Tensor:
    """Attend every row of ``q`` ``[T, Hq, d]`` over ``layer`` of ``kv`` within ``window``
    positions (None: unbounded), scores soft-capped at ``softcap`` (None: not capped), with the
    per-head sink logits ``sinks`` ``[Hq]`` in every softmax (None: no sinks).  ``decode_op``: the
    model's ``PagedAttentionDecode``, whose C kernel attends the decode rows where it can;
    ``prefill_op`` (CPU models: ``DecoderOps.prefill_attention``) attends the multi-row segments
    of a plain cache."""
    if window is not None and window < 1:
        raise ValueError(f"an attention window must be >= 1 position, not {window}")
    if plan.pure_decode:
        return _decode(
            q, kv, layer, *plan.decode_inputs(), plan.decode_max_context, window, plan.scale, softcap, sinks, decode_op
        )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if plan.decode_rows is not None:
        out[plan.decode_rows] = _decode(
            q[plan.decode_rows],
            kv,
            layer,
            *plan.decode_inputs(),
            plan.decode_max_context,
            window,
            plan.scale,
            softcap,
            sinks,
            decode_op,
        )
    if kv.plain and prefill_op is not None and prefill_op.path == "cpu":
        prefill_op(
            out, q, kv.k[layer], kv.v[layer], plan.block_tables, plan.multi_row, plan.scale, window, softcap, sinks
        )
        return out
    codec = _window_codec(kv)
    if codec is not None and codec.prefill_attention(
        kv, layer, out, q, plan.block_tables, plan.multi_row, plan.scale, window, softcap, sinks
    ):
        return out
    for start, end, seq, context_len in plan.multi_row:
        out[start:end] = _segment(
            q[start:end], kv, layer, plan.block_tables[seq], context_len, window, plan.scale, softcap, sinks
        )
    return out
