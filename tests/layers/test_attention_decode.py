"""The split-K paged decode kernel (``kernels/cpu/attention_decode.c``, reached through
``PagedAttentionDecode.forward_cpu``) on each C variant this CPU runs, against the torch oracle
(``attention.decode_attention``), and its batch invariance: a row's bits alone, in a batch of
other lengths, and on 1 or 2 threads."""

from __future__ import annotations

import pytest
import torch

from metrale_core.kernels import KERNELS_ENV
from metrale_core.layers.attention import decode_attention
from metrale_core.layers.ops import PagedAttentionDecode
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa

BLOCK = 16


@pytest.fixture(params=cpu_isa_params())
def op(request, monkeypatch) -> PagedAttentionDecode:
    """The decode op on the C kernels of one ISA variant, forced."""
    use_cpu_isa(monkeypatch, request.param, "metrale_core.layers")
    monkeypatch.setenv(KERNELS_ENV, "cpu")
    op = PagedAttentionDecode("cpu")
    assert op.path == "cpu"
    return op


def _chunk(op: PagedAttentionDecode) -> int:
    return op.cpu_kernel.dop_decode_chunk_len()


def _paged(contexts: list[int], hk: int, d: int, dtype: torch.dtype, seed: int):
    """Caches holding every sequence's context in shuffled blocks (block 0: padding only), their
    block tables and context lengths."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-c // BLOCK) for c in contexts]
    ids = (torch.randperm(sum(need), generator=g) + 1).tolist()
    width = max(need) + 1
    tables = torch.zeros(len(contexts), width, dtype=torch.int64)
    for b, n in enumerate(need):
        tables[b, :n] = torch.tensor(ids[:n], dtype=torch.int64)
        ids = ids[n:]
    shape = (sum(need) + 1, BLOCK, hk, d)
    k_cache = (torch.randn(shape, generator=g) * 3).to(dtype)  # peaked softmax rows
    v_cache = torch.randn(shape, generator=g).to(dtype)
    return k_cache, v_cache, tables, torch.tensor(contexts, dtype=torch.int64), g


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("g", "d"), [(1, 64), (2, 128), (3, 64), (4, 80), (8, 128), (5, 48)])
def test_decode_matches_the_torch_oracle_on_and_across_chunk_boundaries(op, g, d, cache_dtype):
    """Contexts from 1 position to several chunks: exactly a chunk, one either side, two chunks and
    one either side, and a few thousand; head sizes 64 / 128 (specialised loops) and 48 / 80."""
    c = _chunk(op)
    contexts = [1, c - 1, c, c + 1, 2 * c - 1, 2 * c, 2 * c + 1, 3001]
    hk = 2
    k_cache, v_cache, tables, context, gen = _paged(contexts, hk, d, cache_dtype, seed=g * 1000 + d)
    q = torch.randn(len(contexts), g * hk + 3, d, generator=gen)[:, 2 : 2 + g * hk]  # strided rows
    out = op(q, k_cache, v_cache, tables, context, d**-0.5, max(contexts))
    assert op.path == "cpu" and out.shape == q.shape
    ref = decode_attention(q, k_cache, v_cache, tables, context, d**-0.5, max(contexts))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    k_cache[0].fill_(1e4)  # block 0 is only ever padding: poisoning it changes nothing
    v_cache[0].fill_(1e4)
    assert torch.equal(op(q, k_cache, v_cache, tables, context, d**-0.5, max(contexts)), out)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_a_rows_bits_do_not_depend_on_the_batch_or_the_thread_count(op, cache_dtype):
    c = _chunk(op)
    contexts = [3 * c + 17, 5, c, 2 * c + 1, 40]
    hk, g, d = 2, 3, 64
    k_cache, v_cache, tables, context, gen = _paged(contexts, hk, d, cache_dtype, seed=7)
    q = torch.randn(len(contexts), g * hk, d, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batch = op(q, k_cache, v_cache, tables, context, d**-0.5, max(contexts))
        for b in range(len(contexts)):
            alone = op(q[b : b + 1], k_cache, v_cache, tables[b : b + 1], context[b : b + 1], d**-0.5, contexts[b])
            assert torch.equal(alone[0], batch[b])
        tail = op(q[2:], k_cache, v_cache, tables[2:], context[2:], d**-0.5, max(contexts[2:]))
        assert torch.equal(tail, batch[2:])
        torch.set_num_threads(1)
        assert torch.equal(op(q, k_cache, v_cache, tables, context, d**-0.5, max(contexts)), batch)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("window", [1, 255, 256, 257, 700])
def test_a_window_and_sinks_match_the_oracle_and_keep_rows_invariant(op, window):
    """The last ``window`` positions of each context and a sink logit per query head (gpt-oss),
    windows that start inside, on and across chunk boundaries."""
    c = _chunk(op)
    contexts = [1, window, window + 1, c + 3, 2 * c + 5, 3001]
    hk, g, d = 2, 4, 64
    k_cache, v_cache, tables, context, gen = _paged(contexts, hk, d, torch.float32, seed=window)
    q = torch.randn(len(contexts), g * hk, d, generator=gen)
    sinks = torch.randn(g * hk, generator=gen) * 3
    args = (d**-0.5, max(contexts), window, sinks)
    out = op(q, k_cache, v_cache, tables, context, *args)
    torch.testing.assert_close(out, decode_attention(q, k_cache, v_cache, tables, context, *args), rtol=1e-5, atol=1e-5)
    for b in (0, 3, 5):
        alone = op(q[b : b + 1], k_cache, v_cache, tables[b : b + 1], context[b : b + 1], *args)
        assert torch.equal(alone[0], out[b])


def test_an_empty_context_gives_a_zero_row_and_an_empty_batch_nothing(op):
    k_cache, v_cache, tables, _, gen = _paged([20], 1, 16, torch.float32, seed=3)
    q = torch.randn(2, 2, 16, generator=gen)
    context = torch.tensor([0, 20])
    out = op(q, k_cache, v_cache, tables.expand(2, -1).contiguous(), context, 0.25, 20)
    assert torch.equal(out[0], torch.zeros(2, 16))
    torch.testing.assert_close(out[1], decode_attention(q[1:], k_cache, v_cache, tables, context[1:], 0.25, 20)[0])
    assert op(q[:0], k_cache, v_cache, tables[:0], context[:0], 0.25, 0).shape == (0, 2, 16)
