"""The q8_0 KV ops (``kv_q8_ops``) on each C variant this CPU runs: the quantizer against
llama.cpp's rule, the C write against the torch oracle bit for bit, and the decode / prefill C
kernels that read codes and scales directly against (a) the plain float32 C kernels over the
dequantized cache, bit for bit (same chunks, same merge order), (b) the torch oracle, and (c)
batch invariance: a row's bits alone, in a batch, on 1 or 2 threads."""

from __future__ import annotations

import pytest
import torch

from metrale_core.kernels import KERNELS_ENV
from metrale_core.layers.kv_q8_ops import Q8Ops, dequantize_q8_0, quantize_q8_0
from metrale_core.layers.ops import PagedAttentionDecode, PagedAttentionPrefill
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa

BLOCK = 16


@pytest.fixture(params=cpu_isa_params())
def ops(request, monkeypatch) -> tuple[Q8Ops, PagedAttentionDecode, PagedAttentionPrefill]:
    """The q8_0 ops and the plain decode / prefill ops on the C kernels of one ISA variant."""
    use_cpu_isa(monkeypatch, request.param, "metrale_core.layers")
    monkeypatch.setenv(KERNELS_ENV, "cpu")
    q8 = Q8Ops("cpu")
    plain = PagedAttentionDecode("cpu"), PagedAttentionPrefill("cpu")
    assert {q8.write.path, q8.decode.path, q8.prefill.path, plain[0].path, plain[1].path} == {"cpu"}
    return q8, *plain


def test_the_quantizer_is_llama_cpps_q8_0():
    """One scale per 32 values, d = max|x| / 127 (float16), codes round(x / d) made with the
    float32 d, half to even; an all-zero group has scale and codes 0; the error is at most half
    a step (plus the float16 rounding of the scale)."""
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-2.54, 1.0, 32)  # amax 2.54: d = 0.02
    x[0, 32:] = 0.0
    x[1] = torch.randn(64) * 5
    codes, scales = quantize_q8_0(x)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float16 and scales.shape == (2, 2)
    d = torch.tensor(2.54) / 127
    assert scales[0, 0] == d.half() and codes[0, 0] == -127
    assert torch.equal(codes[0, :32], torch.round(x[0, :32] * (1 / d)).to(torch.int8))
    assert scales[0, 1] == 0 and (codes[0, 32:] == 0).all()
    assert codes.abs().max() == 127
    back = dequantize_q8_0(codes, scales)
    step = scales.float().repeat_interleave(32, dim=-1)
    assert ((back - x).abs() <= step * 0.5 + x.abs() * 2**-11).all()


def _paged(contexts: list[int], hk: int, d: int, seed: int):
    """q8_0 caches written by the C write in shuffled blocks (block 0: padding only), the same
    values dequantized as float32 caches, block tables, context lengths and a generator."""
    q8 = Q8Ops("cpu")
    g = torch.Generator().manual_seed(seed)
    need = [-(-c // BLOCK) for c in contexts]
    ids = (torch.randperm(sum(need), generator=g) + 1).tolist()
    tables = torch.zeros(len(contexts), max(need) + 1, dtype=torch.int64)
    for b, n in enumerate(need):
        tables[b, :n] = torch.tensor(ids[:n], dtype=torch.int64)
        ids = ids[n:]
    blocks = sum(need) + 1
    codes = [torch.zeros(blocks, BLOCK, hk, d, dtype=torch.int8) for _ in range(2)]
    scales = [torch.zeros(blocks, BLOCK, hk, d // 32, dtype=torch.float16) for _ in range(2)]
    slots = torch.arange(1, blocks * BLOCK)
    k = torch.randn(slots.numel(), hk, d, generator=g) * 3  # peaked softmax rows
    v = torch.randn(slots.numel(), hk, d, generator=g)
    q8.write(k, v, codes[0], scales[0], codes[1], scales[1], slots)
    storage = (codes[0], scales[0], codes[1], scales[1])
    plain = dequantize_q8_0(codes[0], scales[0]), dequantize_q8_0(codes[1], scales[1])
    return storage, plain, tables, torch.tensor(contexts, dtype=torch.int64), g


def test_the_c_write_is_the_oracles_bits(ops):
    q8 = ops[0]
    gen = torch.Generator().manual_seed(3)
    hk, d = 3, 64
    k = torch.randn(40, hk + 1, d, generator=gen)[:, 1:] * 4  # strided token rows
    v = torch.randn(40, hk, d, generator=gen)
    k[0, 0, :32] = 0.0  # a zero group
    slots = torch.randperm(8 * BLOCK, generator=gen)[:40]
    caches = [
        [torch.zeros(8, BLOCK, hk, w, dtype=dt) for w, dt in ((d, torch.int8), (d // 32, torch.float16)) * 2]
        for _ in range(2)
    ]
    q8.write(k, v, *caches[0], slots)
    q8.write.forward_native(k, v, *caches[1], slots)
    for c, ref in zip(*caches):
        assert torch.equal(c.view(torch.int8), ref.view(torch.int8))
    assert caches[0][0].view(-1, hk, d)[slots].abs().amax() == 127  # written at the slots


@pytest.mark.parametrize(("g", "d"), [(1, 64), (3, 64), (2, 128), (4, 96)])
def test_decode_reads_q8_0_as_the_float32_kernel_reads_its_values(ops, g, d):
    q8, plain, _ = ops
    c = plain.cpu_kernel.dop_decode_chunk_len()
    contexts = [1, c - 1, c, c + 1, 2 * c + 1, 1500]
    hk = 2
    storage, (k, v), tables, context, gen = _paged(contexts, hk, d, seed=g * 100 + d)
    q = torch.randn(len(contexts), g * hk + 2, d, generator=gen)[:, 1 : 1 + g * hk]  # strided rows
    args = (tables, context, d**-0.5, max(contexts))
    out = q8.decode(q, storage, *args)
    assert torch.equal(out, plain(q, k, v, *args))
    torch.testing.assert_close(out, q8.decode.forward_native(q, storage, *args), rtol=1e-5, atol=1e-5)
    windowed = q8.decode(q, storage, *args, window=300)
    assert torch.equal(windowed, plain(q, k, v, *args, window=300))
    for t in storage:  # block 0 is only ever padding
        t[0] = 100
    assert torch.equal(q8.decode(q, storage, *args), out)


def test_a_decode_rows_bits_do_not_depend_on_the_batch_or_the_thread_count(ops):
    q8 = ops[0]
    contexts = [3 * 256 + 17, 5, 256, 513, 40]
    hk, g, d = 2, 3, 64
    storage, _, tables, context, gen = _paged(contexts, hk, d, seed=7)
    q = torch.randn(len(contexts), g * hk, d, generator=gen)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batch = q8.decode(q, storage, tables, context, d**-0.5, max(contexts))
        for b in range(len(contexts)):
            for n in (1, 2):
                torch.set_num_threads(n)
                alone = q8.decode(q[b : b + 1], storage, tables[b : b + 1], context[b : b + 1], d**-0.5, 1)
                assert torch.equal(alone, batch[b : b + 1]), (b, n)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(("hq", "hk", "d"), [(9, 3, 64), (4, 2, 128), (6, 2, 96)])
def test_prefill_reads_q8_0_as_the_float32_kernel_reads_its_values(ops, hq, hk, d):
    q8, _, plain = ops
    storage, (k, v), tables, _, gen = _paged([300, 90], hk, d, seed=hq + d)
    q = torch.randn(300 + 60, hq, d, generator=gen)
    segments = ((0, 300, 0, 300), (300, 360, 1, 90))  # a whole prompt, a chunk after a prefix
    out, ref = torch.full(q.shape, 7.0), torch.full(q.shape, 7.0)
    q8.prefill(out, q, storage, tables, segments, d**-0.5)
    plain(ref, q, k, v, tables, segments, d**-0.5)
    assert torch.equal(out, ref)
    oracle = torch.full(q.shape, 7.0)
    q8.prefill.forward_native(oracle, q, storage, tables, segments, d**-0.5)
    torch.testing.assert_close(out, oracle, rtol=1e-4, atol=1e-5)
    threads = torch.get_num_threads()
    try:  # a chunk's rows: the same bits split differently, alone, on one thread
        torch.set_num_threads(1)
        chunk = torch.full((100, hq, d), 7.0)
        q8.prefill(chunk, q[100:200], storage, tables, ((0, 100, 0, 200),), d**-0.5)
        assert torch.equal(chunk, out[100:200])
    finally:
        torch.set_num_threads(threads)
