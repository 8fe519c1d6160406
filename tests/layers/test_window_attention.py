"""``windowed_paged_attention`` against a dense masked-softmax reference over the raw K/V.

Random block tables (not the identity), a batch mixing decode rows and multi-row segments,
windows shorter and longer than the contexts, soft-capping on and off, attention sinks on and off
(their reference: transformers' gpt-oss softmax over the scores and a sink column), GQA 2; the
guarantee the block manager relies on: blocks wholly outside every row's window are never read;
and with sinks, a row's result is the same bits alone and in a batch.  The decode rows through the
C decode kernel (window and sinks in the kernel) against the torch path, on each ISA variant; on CPU
the multi-row segments through the tiled C prefill kernel (``prefill_op``): the torch path's values,
and the same never-read guarantee.  A q8_0 cache (``Q8KVCodec``: ``attends_windows``) attends
both kinds of rows in its own C kernels: the bits the float32 C kernels give over the dequantized
cache, the torch path's values, no block outside a window read, each decode row the same bits
alone and in a batch on 1 or 2 threads; where the kernels do not run, the torch gather path.
"""

from __future__ import annotations

import math

import pytest
import torch

from metrale_core.kernels import KERNELS_ENV
from metrale_core.layers.attention import AttentionPlan, paged_attention
from metrale_core.layers.decoder_ops import DecoderOps
from metrale_core.layers.kv_q8_codec import Q8KVCodec, q8_0_layout
from metrale_core.layers.kv_q8_ops import dequantize_q8_0, quantize_q8_0
from metrale_core.layers.op_support import KERNEL_PACKAGE
from metrale_core.layers.ops import PagedAttentionDecode
from metrale_core.layers.window_attention import windowed_paged_attention
from metrale_core.model_api import ForwardBatch, KVLayout, PagedKVCache
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa

BS, HQ, HK, D = 4, 4, 2, 8


def _reference(q, k, v, pos, window, softcap, scale, sinks=None):
    """Row at ``pos`` over keys ``0..pos`` of ``k``/``v`` ``[L, Hk, d]`` (dense maths); ``sinks``
    ``[Hq]``: a column of sink logits in the softmax, dropped after it (no value)."""
    keys = torch.arange(k.shape[0])
    allowed = keys <= pos
    if window is not None:
        allowed &= keys > pos - window
    kk = k.repeat_interleave(HQ // HK, dim=1)
    vv = v.repeat_interleave(HQ // HK, dim=1)
    scores = torch.einsum("hd,lhd->hl", q, kk) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores[:, ~allowed] = float("-inf")
    if sinks is not None:
        probs = torch.softmax(torch.cat([scores, sinks[:, None]], dim=-1), -1)[:, :-1]
        return torch.einsum("hl,lhd->hd", probs, vv)
    return torch.einsum("hl,lhd->hd", torch.softmax(scores, -1), vv)


def _setup(seed: int, work: list[tuple[int, int]], d: int = D):
    """``work``: (context_len, query_len) per sequence.  Returns batch, kv, q, per-seq K/V."""
    g = torch.Generator().manual_seed(seed)
    kv = PagedKVCache.allocate(KVLayout(num_layers=1, num_kv_heads=HK, head_dim=d), 64, BS)
    free = torch.randperm(64, generator=g).tolist()
    tables, seq_kv, slots, positions, qlens, clens = [], [], [], [], [], []
    for ctx, n in work:
        table = [free.pop() for _ in range(-(-ctx // BS))]
        k = torch.randn(ctx, HK, d, generator=g)
        v = torch.randn(ctx, HK, d, generator=g)
        for p in range(ctx):
            kv.k[0][table[p // BS], p % BS] = k[p]
            kv.v[0][table[p // BS], p % BS] = v[p]
        tables.append(table)
        seq_kv.append((k, v))
        positions += range(ctx - n, ctx)
        slots += [table[p // BS] * BS + p % BS for p in range(ctx - n, ctx)]
        qlens.append(n)
        clens.append(ctx)
    width = max(map(len, tables))
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)
    rows = sum(qlens)
    batch = ForwardBatch(
        input_ids=t([0] * rows),
        positions=t(positions),
        query_start=t([0, *torch.tensor(qlens).cumsum(0).tolist()]),
        context_lens=t(clens),
        block_tables=t([tb + [0] * (width - len(tb)) for tb in tables]),
        slot_mapping=t(slots),
        logits_rows=t(list(range(rows))),
        state_slots=t([-1] * len(work)),
        state_fresh=torch.zeros(len(work), dtype=torch.bool),
        query_lens_host=tuple(qlens),
        context_lens_host=tuple(clens),
        block_size=BS,
    )
    q = torch.randn(rows, HQ, d, generator=g)
    return batch, kv, q, seq_kv, tables


WORKS = {"pure-decode": [(23, 1), (5, 1), (14, 1)], "mixed": [(23, 1), (17, 9), (3, 3), (30, 1), (12, 5)]}


@pytest.mark.parametrize("work", sorted(WORKS))
@pytest.mark.parametrize("window", [None, 1, 5, 8, 100])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("sinks", [None, [2.0, -1.0, 0.5, 4.0]])
def test_matches_dense_reference(work, window, softcap, sinks):
    batch, kv, q, seq_kv, _ = _setup(len(work) + (window or 0), WORKS[work])
    scale = 0.3
    plan = AttentionPlan.from_batch(batch, scale)
    sink = None if sinks is None else torch.tensor(sinks)
    out = windowed_paged_attention(q, kv, 0, plan, window=window, softcap=softcap, sinks=sink)
    row = 0
    worst = 0.0
    for (ctx, n), (k, v) in zip(WORKS[work], seq_kv, strict=True):
        for j in range(n):
            ref = _reference(q[row], k, v, ctx - n + j, window, softcap, scale, sink)
            worst = max(worst, (out[row] - ref).abs().max().item())
            row += 1
    assert worst <= 1e-5


def test_no_window_no_softcap_equals_paged_attention():
    batch, kv, q, _, _ = _setup(7, WORKS["mixed"])
    plan = AttentionPlan.from_batch(batch, 1 / math.sqrt(D))
    ops = DecoderOps("cpu")
    want = paged_attention(q, kv, 0, plan, ops.decode_attention, ops.prefill_attention)
    got = windowed_paged_attention(q, kv, 0, plan, window=None)
    assert (got - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("work", sorted(WORKS))
def test_blocks_outside_the_window_are_never_read(work):
    """Poison every block no row's window reaches: the output must not change."""
    window = 5
    batch, kv, q, _, tables = _setup(3, WORKS[work])
    plan = AttentionPlan.from_batch(batch, 0.5)
    want = windowed_paged_attention(q, kv, 0, plan, window=window)
    for (ctx, n), table in zip(WORKS[work], tables, strict=True):
        first_visible = max(0, ctx - n - window + 1)
        for b in table[: first_visible // BS]:
            kv.k[0][b] = float("nan")
            kv.v[0][b] = float("nan")
    got = windowed_paged_attention(q, kv, 0, plan, window=window)
    assert torch.equal(got, want)


@pytest.mark.parametrize("window", [None, 5])
def test_sinks_take_probability_and_a_row_is_the_same_bits_in_any_batch(window):
    """A large sink takes most of each softmax (the output shrinks towards zero), a sink of
    -inf none; each decode row of a batch equals that row attended alone, bit for bit."""
    batch, kv, q, _, _ = _setup(11, WORKS["pure-decode"])
    plan = AttentionPlan.from_batch(batch, 0.5)
    plain = windowed_paged_attention(q, kv, 0, plan, window=window)
    none = windowed_paged_attention(q, kv, 0, plan, window=window, sinks=torch.full((HQ,), float("-inf")))
    assert (none - plain).abs().max().item() <= 1e-6
    heavy = windowed_paged_attention(q, kv, 0, plan, window=window, sinks=torch.full((HQ,), 30.0))
    assert heavy.abs().max().item() < 1e-6 * plain.abs().max().item()
    sinks = torch.tensor([2.0, -1.0, 0.5, 4.0])
    together = windowed_paged_attention(q, kv, 0, plan, window=window, sinks=sinks)
    tables, context = plan.decode_inputs()
    for b in range(3):  # row b's own plan: a batch of one decode row
        one = AttentionPlan(
            plan.scale, True, None, tables[b : b + 1], context[b : b + 1], int(context[b]), (), tables[b : b + 1]
        )
        alone = windowed_paged_attention(q[b : b + 1], kv, 0, one, window=window, sinks=sinks)
        assert torch.equal(alone, together[b : b + 1])


def test_window_must_be_positive():
    batch, kv, q, _, _ = _setup(1, WORKS["pure-decode"])
    with pytest.raises(ValueError, match="window"):
        windowed_paged_attention(q, kv, 0, AttentionPlan.from_batch(batch, 1.0), window=0)


@pytest.fixture(params=cpu_isa_params())
def c_decode(request, monkeypatch):
    """The decode op on the C kernels of one ISA variant, and a list counting its kernel calls."""
    use_cpu_isa(monkeypatch, request.param, "metrale_core.layers")
    monkeypatch.setenv(KERNELS_ENV, "cpu")
    op = PagedAttentionDecode("cpu")
    kernel, calls = op.cpu_kernel.dop_paged_decode, []
    monkeypatch.setattr(op.cpu_kernel, "dop_paged_decode", lambda *a: calls.append(a) or kernel(*a))
    return op, calls


@pytest.mark.parametrize("work", sorted(WORKS))
@pytest.mark.parametrize("window", [None, 1, 5, 8, 100])
@pytest.mark.parametrize("sinks", [None, [2.0, -1.0, 0.5, 4.0]])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_decode_rows_through_the_c_kernel_match_the_torch_path(c_decode, work, window, sinks, softcap):
    op, calls = c_decode
    batch, kv, q, _, _ = _setup(len(work) + (window or 0), WORKS[work], d=32)
    plan = AttentionPlan.from_batch(batch, 0.3)
    sink = None if sinks is None else torch.tensor(sinks)
    want = windowed_paged_attention(q, kv, 0, plan, window=window, sinks=sink, softcap=softcap)
    got = windowed_paged_attention(q, kv, 0, plan, window=window, sinks=sink, softcap=softcap, decode_op=op)
    assert len(calls) == 1  # the decode rows, in one call; multi-row segments stay on torch
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sinks", [None, [2.0, -1.0, 0.5, 4.0]])
def test_the_c_kernel_reads_no_block_outside_the_window(c_decode, sinks):
    op, calls = c_decode
    window = 5
    batch, kv, q, _, tables = _setup(3, WORKS["pure-decode"], d=32)
    plan = AttentionPlan.from_batch(batch, 0.5)
    sink = None if sinks is None else torch.tensor(sinks)
    want = windowed_paged_attention(q, kv, 0, plan, window=window, sinks=sink, decode_op=op)
    for (ctx, _), table in zip(WORKS["pure-decode"], tables, strict=True):
        for b in table[: max(0, ctx - window) // BS]:
            kv.k[0][b] = float("nan")
            kv.v[0][b] = float("nan")
    assert torch.equal(windowed_paged_attention(q, kv, 0, plan, window=window, sinks=sink, decode_op=op), want)
    assert len(calls) == 2


@pytest.mark.parametrize("isa", cpu_isa_params())
@pytest.mark.parametrize("window", [None, 1, 5, 100])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("sinks", [None, [2.0, -1.0, 0.5, 4.0]])
def test_the_c_prefill_kernel_attends_windowed_segments(isa, window, softcap, sinks, monkeypatch):
    use_cpu_isa(monkeypatch, isa, KERNEL_PACKAGE)
    monkeypatch.setenv(KERNELS_ENV, "cpu")
    op = DecoderOps("cpu").prefill_attention
    assert op is not None and op.path == "cpu"
    kernel, calls = op.cpu_kernel.ap_paged_prefill, []
    monkeypatch.setattr(op.cpu_kernel, "ap_paged_prefill", lambda *a: calls.append(a) or kernel(*a))
    batch, kv, q, _, tables = _setup(11, WORKS["mixed"], d=16)
    plan = AttentionPlan.from_batch(batch, 0.25)
    sink = None if sinks is None else torch.tensor(sinks)
    want = windowed_paged_attention(q, kv, 0, plan, window=window, softcap=softcap, sinks=sink)
    got = windowed_paged_attention(q, kv, 0, plan, window=window, softcap=softcap, sinks=sink, prefill_op=op)
    assert len(calls) == 1  # every multi-row segment in one call of the C kernel
    rows = torch.cat([torch.arange(s, e) for s, e, _, _ in plan.multi_row])
    assert (got[rows] - want[rows]).abs().max().item() <= 1e-5
    if window is not None:
        for (ctx, n), table in zip(WORKS["mixed"], tables, strict=True):
            for b in table[: max(0, ctx - n - window + 1) // BS]:
                kv.k[0][b] = float("nan")
                kv.v[0][b] = float("nan")
        again = windowed_paged_attention(q, kv, 0, plan, window=window, softcap=softcap, sinks=sink, prefill_op=op)
        assert torch.equal(again[rows], got[rows])


def _q8_setup(seed: int, work: list[tuple[int, int]]):
    """``_setup`` with d = 32 and a q8_0 copy of its cache; the float32 cache then holds the
    dequantized values (the q8_0 cache's exact reading).  Returns batch, plain kv, q8_0 kv, q, tables."""
    batch, kv, q, _, tables = _setup(seed, work, d=32)
    q8 = PagedKVCache.allocate(q8_0_layout(KVLayout(1, HK, 32), torch.device("cpu")), 64, BS, codec=Q8KVCodec())
    for plain, codes, scales in ((kv.k, q8.k, q8.k_scales), (kv.v, q8.v, q8.v_scales)):
        c, d = quantize_q8_0(plain[0])
        codes[0].copy_(c)
        scales[0].copy_(d)
        plain[0].copy_(dequantize_q8_0(c, d))
    return batch, kv, q8, q, tables


@pytest.fixture(params=cpu_isa_params())
def q8_kernels(request, monkeypatch):
    """The C kernels of one ISA variant: the float32 ``DecoderOps`` and a dict counting the calls
    of the q8_0 kernels (the library every ``Q8KVCodec`` built in the test runs)."""
    use_cpu_isa(monkeypatch, request.param, KERNEL_PACKAGE)
    monkeypatch.setenv(KERNELS_ENV, "cpu")
    library = Q8KVCodec().ops.decode.cpu_kernel
    assert Q8KVCodec().ops.prefill.cpu_kernel is library
    calls = dict.fromkeys(("dop_paged_decode_q8", "ap_paged_prefill_q8"), 0)
    for name in calls:
        kernel = getattr(library, name)
        monkeypatch.setattr(library, name, lambda *a, _k=kernel, _n=name: calls.update({_n: calls[_n] + 1}) or _k(*a))
    return DecoderOps("cpu"), calls


@pytest.mark.parametrize("work", sorted(WORKS))
@pytest.mark.parametrize("window", [None, 1, 5, 100])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("sinks", [None, [2.0, -1.0, 0.5, 4.0]])
def test_q8_0_rows_run_its_c_kernels_with_the_float_kernels_bits(q8_kernels, work, window, softcap, sinks):
    ops, calls = q8_kernels
    batch, kv, q8, q, tables = _q8_setup(len(work) + (window or 0), WORKS[work])
    plan = AttentionPlan.from_batch(batch, 0.3)
    extra = {"window": window, "softcap": softcap, "sinks": None if sinks is None else torch.tensor(sinks)}
    got = windowed_paged_attention(q, q8, 0, plan, **extra, decode_op=ops.decode_attention)
    mixed = work == "mixed"
    assert calls == {"dop_paged_decode_q8": 1, "ap_paged_prefill_q8": int(mixed)}  # not the gather
    floats = windowed_paged_attention(
        q, kv, 0, plan, **extra, decode_op=ops.decode_attention, prefill_op=ops.prefill_attention
    )
    assert torch.equal(got, floats)
    torch.testing.assert_close(got, windowed_paged_attention(q, kv, 0, plan, **extra), rtol=1e-5, atol=1e-5)
    if window is not None:  # NaN scales in every block no row's window reaches: never read
        for (ctx, n), table in zip(WORKS[work], tables, strict=True):
            for b in table[: max(0, ctx - n - window + 1) // BS]:
                q8.k_scales[0][b] = float("nan")
                q8.v_scales[0][b] = float("nan")
        assert torch.equal(windowed_paged_attention(q, q8, 0, plan, **extra), got)


@pytest.mark.parametrize("window", [None, 5])
def test_a_q8_0_decode_rows_bits_do_not_depend_on_the_batch_or_the_thread_count(q8_kernels, window):
    _, calls = q8_kernels
    batch, _, q8, q, _ = _q8_setup(5, WORKS["pure-decode"])
    plan = AttentionPlan.from_batch(batch, 0.5)
    extra = {"window": window, "softcap": 3.0, "sinks": torch.tensor([2.0, -1.0, 0.5, 4.0])}
    tables, context = plan.decode_inputs()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = windowed_paged_attention(q, q8, 0, plan, **extra)
        for b in range(3):
            one = AttentionPlan(
                plan.scale, True, None, tables[b : b + 1], context[b : b + 1], int(context[b]), (), tables[b : b + 1]
            )
            for n in (1, 2):
                torch.set_num_threads(n)
                assert torch.equal(windowed_paged_attention(q[b : b + 1], q8, 0, one, **extra), together[b : b + 1])
    finally:
        torch.set_num_threads(threads)
    assert calls["dop_paged_decode_q8"] == 7


def test_q8_0_rows_the_kernels_do_not_take_stay_on_the_torch_gather(monkeypatch):
    """On the torch path (no C kernels) the q8_0 codec declines windowed rows: the gather path
    attends them, as over the float32 cache of the dequantized values."""
    monkeypatch.setenv(KERNELS_ENV, "native")
    batch, kv, q8, q, _ = _q8_setup(2, WORKS["mixed"])
    assert q8.codec.ops.decode.path == "native"
    plan = AttentionPlan.from_batch(batch, 0.3)
    extra = {"window": 5, "softcap": 3.0, "sinks": torch.tensor([2.0, -1.0, 0.5, 4.0])}
    out = torch.empty(q.shape)
    assert not q8.codec.prefill_attention(q8, 0, out, q, plan.block_tables, plan.multi_row, plan.scale, 5)
    assert q8.codec.decode_attention(q8, 0, q[:1], *plan.decode_inputs(), plan.scale, 23, 5) is None
    got = windowed_paged_attention(q, q8, 0, plan, **extra)
    torch.testing.assert_close(got, windowed_paged_attention(q, kv, 0, plan, **extra), rtol=1e-5, atol=1e-5)
