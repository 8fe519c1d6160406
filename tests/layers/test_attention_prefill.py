"""The tiled prefill attention kernel (``kernels/cpu/attention_prefill.c``, behind
``PagedAttentionPrefill.forward_cpu``) on each C variant this CPU runs (AVX512 and AVX2 here):
the torch oracle's values (``attention.prefill_attention``) to float32 rounding over contexts of
several key tiles, prefix hits, chunks that do not start on a tile boundary, GQA, head sizes 64,
128, 80 and 256, bfloat16 caches and a sliding window; and every row the same bits whatever the
rest of the call (one segment or chunks, beside other sequences, 1 or 2 threads)."""

from __future__ import annotations

import itertools

import pytest
import torch

from metrale_core.kernels import KERNELS_ENV
from metrale_core.layers.op_support import KERNEL_PACKAGE
from metrale_core.layers.ops import PagedAttentionPrefill
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa

BLOCK = 16


@pytest.fixture(params=cpu_isa_params())
def op(request, monkeypatch) -> PagedAttentionPrefill:
    use_cpu_isa(monkeypatch, request.param, KERNEL_PACKAGE)
    monkeypatch.setenv(KERNELS_ENV, "cpu")
    op = PagedAttentionPrefill("cpu")
    assert op.path == "cpu"
    return op


def _cache(seed: int, hk: int, d: int, dtype=torch.float32, blocks: int = 64):
    """Random ``[blocks, BLOCK, hk, d]`` caches and a generator for the rest of the test."""
    gen = torch.Generator().manual_seed(seed)
    k = (torch.randn(blocks, BLOCK, hk, d, generator=gen) * 2).to(dtype)  # peaked softmax rows
    v = torch.randn(blocks, BLOCK, hk, d, generator=gen).to(dtype)
    return k, v, gen


def _tables(gen, sequences: int, blocks: int = 64, width: int = 30) -> torch.Tensor:
    """Distinct shuffled blocks per sequence (block order within a sequence is not the cache's)."""
    return torch.randperm(blocks, generator=gen)[: sequences * width].view(sequences, width).contiguous()


def _run(op, q, k, v, tables, segments, window=None, rows=None) -> torch.Tensor:
    out = torch.full((rows or q.shape[0], q.shape[1], q.shape[2]), 7.0)
    op(out, q, k, v, tables, segments, q.shape[2] ** -0.5, window)
    return out


@pytest.mark.parametrize(
    ("hq", "hk", "d", "cache_dtype"),
    [
        (9, 3, 64, torch.float32),  # SmolLM2's layer shape
        (4, 2, 128, torch.float32),
        (6, 2, 80, torch.float32),  # a head size that is not a multiple of the P @ V block
        (16, 2, 256, torch.float32),  # the largest head size, G = 8 (fewer rows per work item)
        (7, 1, 64, torch.bfloat16),  # odd G, bfloat16 cache read widened
    ],
)
@pytest.mark.parametrize("window", [None, 37])
def test_matches_the_torch_oracle(op, hq, hk, d, cache_dtype, window):
    k, v, gen = _cache(hq * d, hk, d, cache_dtype, blocks=140)
    tables = _tables(gen, 3, blocks=140, width=45)
    # a whole 300-position prompt (5 key tiles), a 183-row chunk after a 517-position prefix hit
    # (neither end on a tile boundary), and a 2-row verify-like segment
    segments = ((0, 300, 0, 300), (300, 483, 1, 700), (483, 485, 2, 130))
    q = torch.randn(486, hq + 2, d, generator=gen)[:, 1 : hq + 1]  # strided heads of a fused qkv
    out = _run(op, q, k, v, tables, segments, window)
    want = torch.full_like(out, 7.0)
    op.forward_native(want, q, k, v, tables, segments, d**-0.5, window)
    torch.testing.assert_close(out[:485], want[:485], rtol=1e-5, atol=5e-6)
    assert (out[485] == 7.0).all()  # a row outside every segment (a decode row) is left alone


def test_a_window_of_one_returns_each_rows_own_value(op):
    """Softmax over one key: probability exactly 1, so the output is the cached value's bits."""
    k, v, gen = _cache(5, 2, 64)
    tables = _tables(gen, 1)
    q = torch.randn(90, 4, 64, generator=gen)
    out = _run(op, q, k, v, tables, ((0, 90, 0, 200),), window=1)
    positions = torch.arange(110, 200)
    slots = tables[0, positions // BLOCK] * BLOCK + positions % BLOCK
    own = v.view(-1, 2, 64)[slots].repeat_interleave(2, dim=1)
    assert torch.equal(out, own)


@pytest.mark.parametrize("window", [None, 100])
def test_each_row_is_the_same_bits_in_any_split_company_and_thread_count(op, window):
    hq, hk, d, context = 9, 3, 64, 333
    k, v, gen = _cache(11, hk, d)
    tables = _tables(gen, 2)
    q = torch.randn(context, hq, d, generator=gen)
    other = torch.randn(40, hq, d, generator=gen)
    whole = _run(op, q, k, v, tables, ((0, context, 0, context),), window)
    # chunked prefill: each chunk over the prefix the chunks before it cached
    for cuts in ((0, 70, 203, context), (0, 64, 128, 129, 300, context), (0, 5, context)):
        for lo, hi in itertools.pairwise(cuts):
            if hi - lo > 1:  # a one-row chunk is a decode row: another kernel
                chunk = _run(op, q[lo:hi], k, v, tables, ((0, hi - lo, 0, hi),), window)
                assert torch.equal(chunk, whole[lo:hi]), (cuts, lo, hi)
    # beside another sequence's segment, at other row offsets of the call
    both = torch.cat((other, q[150:]))
    mixed = _run(op, both, k, v, tables, ((0, 40, 1, 90), (40, 40 + context - 150, 0, context)), window)
    assert torch.equal(mixed[40:], whole[150:])
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(_run(op, q, k, v, tables, ((0, context, 0, context),), window), whole)
    finally:
        torch.set_num_threads(threads)


def test_positions_past_the_context_and_padding_blocks_are_never_read(op):
    k, v, gen = _cache(3, 2, 128, blocks=12)
    tables = torch.tensor([[5, 9, 2, 0, 0], [7, 1, 0, 0, 0]])  # 0: padding
    q = torch.randn(50, 4, 128, generator=gen)
    segments = ((0, 30, 0, 41), (30, 50, 1, 20))  # both contexts end inside a block
    out = _run(op, q, k, v, tables, segments)
    for cache in (k, v):
        cache[0] = float("nan")
        cache[2, 41 - 2 * BLOCK :] = float("nan")
        cache[1, 20 - BLOCK :] = float("nan")
    assert torch.equal(_run(op, q, k, v, tables, segments), out)


def test_no_segments_leave_out_untouched(op):
    k, v, gen = _cache(4, 1, 64, blocks=4)
    q = torch.randn(3, 2, 64, generator=gen)
    assert (_run(op, q, k, v, torch.zeros(1, 4, dtype=torch.int64), ()) == 7.0).all()


def test_blocks_that_slid_out_of_every_window_are_never_read(op):
    """A windowed chunk: the blocks wholly before its first row's window are released by the block
    manager (table entry ``NULL_BLOCK`` = -1, the block reused and overwritten): same bits.  Three
    positions a block, so the window's first position (183) starts a block that does not start a
    tile's score block."""
    gen = torch.Generator().manual_seed(8)
    k, v = torch.randn(110, 3, 2, 64, generator=gen), torch.randn(110, 3, 2, 64, generator=gen)
    tables = torch.randperm(110, generator=gen)[:100].view(1, 100).contiguous()
    q = torch.randn(100, 4, 64, generator=gen)
    segments, window = ((0, 100, 0, 300),), 18  # rows at 200..299 see from 183 on: block 61
    out = _run(op, q, k, v, tables, segments, window)
    want = torch.empty_like(out)
    op.forward_native(want, q, k, v, tables, segments, 64**-0.5, window)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=5e-6)
    gone = tables[0, :61].clone()
    k[gone], v[gone] = float("nan"), float("nan")
    tables[0, :61] = -1
    assert torch.equal(_run(op, q, k, v, tables, segments, window), out)
