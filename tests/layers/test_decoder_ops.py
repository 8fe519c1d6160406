"""The CPU ops against straightforward float64 formulas, on both CPU paths: the torch reference
(``forward_native``, the oracle) and the C kernels of ``kernels/cpu/decoder_ops.c``
(``forward_cpu``, where they run)."""

from __future__ import annotations

import math

import pytest
import torch

from metrale_core.kernels import KERNELS_ENV, cpu_unavailable_reason
from metrale_core.kernels.cpu import cpu_capable
from metrale_core.layers.attention import DecodeGather, attend_decode_gathered, prefill_attention
from metrale_core.layers.decoder_ops import DecoderOps
from metrale_core.layers.op_support import KERNEL_PACKAGE
from metrale_core.layers.pointwise.functional import apply_rope, rope_cos_sin, rope_inv_freq
from metrale_core.testing.requires import missing, use_kernel_path

GEN = torch.Generator().manual_seed(1234)
CPU_SKIP = cpu_unavailable_reason(KERNEL_PACKAGE)


def randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=GEN).to(dtype)


@pytest.fixture
def ops(kernel_path) -> DecoderOps:
    """The decoder's ops on one CPU path: torch, or the C kernels of each variant the CPU runs."""
    return DecoderOps("cpu")


@pytest.fixture
def native_ops(monkeypatch) -> DecoderOps:
    use_kernel_path(monkeypatch, "native", "metrale_core.layers")
    return DecoderOps("cpu")


def _all(ops: DecoderOps):
    return (ops.rms_norm, ops.qk_norm_rope, ops.swiglu, ops.kv_write, ops.decode_attention, ops.prefill_attention)


def test_ops_choose_the_c_kernels_on_cpu_unless_native_is_forced(monkeypatch):
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    if CPU_SKIP and cpu_capable():
        missing(f"the C kernels do not run on this capable CPU: {CPU_SKIP}")
    expected = "native" if CPU_SKIP else "cpu"
    assert all(op.path == expected and op.device.type == "cpu" for op in _all(DecoderOps("cpu")))
    monkeypatch.setenv(KERNELS_ENV, "native")
    assert all(op.path == "native" and op.cpu_kernel is None for op in _all(DecoderOps("cpu")))


def test_rms_norm_matches_formula_and_casts_before_weight(ops):
    x, w = randn(5, 24), randn(24)
    ref = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6).double(), ref, rtol=1e-5, atol=1e-5)
    xb, wb = x.bfloat16(), w.bfloat16()
    x32 = xb.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    out = ops.rms_norm(xb, wb, 1e-6)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, wb * normed)  # bf16 product of bf16 operands, as HF computes it


@pytest.mark.parametrize("use_norm", [True, False])
def test_qk_norm_rope_rotates_pairs_i_and_i_plus_half(use_norm, ops):
    tokens, hq, hk, d, theta = 6, 4, 2, 16, 10000.0
    q, k = randn(tokens, hq, d), randn(tokens, hk, d)
    qw, kw = (randn(d), randn(d)) if use_norm else (None, None)
    positions = torch.tensor([0, 1, 5, 6, 7, 40])
    cos, sin = rope_cos_sin(positions, rope_inv_freq(d, theta), torch.float32)
    q_out, k_out = ops.qk_norm_rope(q.clone(), k.clone(), qw, kw, cos, sin, 1e-6)  # may rotate in place

    def reference(x, w):
        x = x.double()
        if w is not None:
            x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        half = d // 2
        ang = positions.double()[:, None] * theta ** (-2 * torch.arange(half).double() / d)  # [T, d/2]
        c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    torch.testing.assert_close(q_out.double(), reference(q, qw), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k_out.double(), reference(k, kw), rtol=1e-4, atol=1e-4)


def test_rope_linear_and_llama3_scaling():
    base = rope_inv_freq(32, 500000.0)
    torch.testing.assert_close(rope_inv_freq(32, 500000.0, {"rope_type": "linear", "factor": 4.0}), base / 4)
    llama3 = rope_inv_freq(
        32,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    wavelen = 2 * math.pi / base
    assert torch.equal(llama3[wavelen < 8192 / 4], base[wavelen < 8192 / 4])  # high freq untouched
    torch.testing.assert_close(llama3[wavelen > 8192], base[wavelen > 8192] / 8)  # low freq / factor
    middle = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert middle.any() and torch.all(llama3[middle] < base[middle])
    assert torch.all(llama3[middle] > base[middle] / 8)


def test_swiglu_matches_formula(ops):
    gate_up = randn(7, 2 * 12) * 6  # far into both tails of the sigmoid
    g, u = gate_up[:, :12].double(), gate_up[:, 12:].double()
    torch.testing.assert_close(ops.swiglu(gate_up).double(), g * torch.sigmoid(g) * u, rtol=1e-6, atol=1e-6)


def test_kv_write_touches_only_the_mapped_slots(ops):
    k_cache, v_cache = torch.zeros(6, 4, 2, 8), torch.zeros(6, 4, 2, 8)
    k, v = randn(3, 2, 8), randn(3, 2, 8)
    slots = torch.tensor([9, 22, 3])
    ops.kv_write(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, 2, 8), v_cache.view(-1, 2, 8)
    assert torch.equal(flat_k[slots], k) and torch.equal(flat_v[slots], v)
    untouched = torch.ones(24, dtype=torch.bool)
    untouched[slots] = False
    assert flat_k[untouched].abs().sum() == 0 and flat_v[untouched].abs().sum() == 0


def test_kv_write_rounds_into_a_bfloat16_cache_as_torch_does(ops):
    """float32 K/V into a bfloat16 cache: round to nearest even (ties, the largest finite values,
    infinities and NaN included), bit for bit what ``.to(torch.bfloat16)`` gives."""
    k_cache, v_cache = torch.zeros(6, 4, 2, 16, dtype=torch.bfloat16), torch.zeros(6, 4, 2, 16, dtype=torch.bfloat16)
    k, v = randn(3, 2, 16) * 100, randn(3, 2, 16)
    ties = torch.tensor(
        [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.3895e38, float("inf"), float("-inf"), float("nan"), 1e-40]
    )  # halfway cases, overflow, subnormal
    k[0, 0, :8] = ties
    slots = torch.tensor([9, 22, 3])
    ops.kv_write(k, v, k_cache, v_cache, slots)
    got_k, got_v = k_cache.view(-1, 2, 16)[slots], v_cache.view(-1, 2, 16)[slots]
    assert torch.equal(got_k.view(torch.int16), k.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(got_v.view(torch.int16), v.to(torch.bfloat16).view(torch.int16))


def _naive_attention(q, keys, values, scale):
    """q [n, Hq, d] over keys/values [c, Hk, d], row i attending to keys 0..c-n+i (float64)."""
    n, hq, _ = q.shape
    c, hk, _ = keys.shape
    keys = keys.double().repeat_interleave(hq // hk, dim=1)
    values = values.double().repeat_interleave(hq // hk, dim=1)
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(n):
        visible = c - n + i + 1
        for h in range(hq):
            p = torch.softmax(keys[:visible, h] @ q[i, h].double() * scale, dim=0)
            out[i, h] = p @ values[:visible, h]
    return out


def _paged_cache(num_blocks=10, block_size=4, hk=2, d=8):
    return randn(num_blocks, block_size, hk, d), randn(num_blocks, block_size, hk, d)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq, d", [(2, 8), (8, 8), (2, 16), (6, 64), (4, 128), (2, 48)])
def test_decode_attention_matches_per_sequence_softmax(hq, d, cache_dtype, ops):
    """Head sizes 64 and 128 run specialised C loops, 16 and 48 the generic one; 8 is routed to
    the torch path.  A bfloat16 cache is read widened to float32 (exactly)."""
    k_cache, v_cache = (c.to(cache_dtype) for c in _paged_cache(d=d))
    k_cache *= 3  # peaked softmax rows
    tables = torch.tensor([[7, 2, 9, 0, 0], [4, 0, 0, 0, 0], [1, 3, 5, 8, 6]])  # 0 = padding
    context = torch.tensor([9, 4, 19])  # crosses, ends on, and spans more than 16 positions
    q = randn(3, hq + 3, d)[:, 1 : hq + 1]  # a strided view, as split from a fused qkv projection
    out = ops.decode_attention(q, k_cache, v_cache, tables, context, d**-0.5, 19)
    for b in range(3):
        c = int(context[b])
        keys = k_cache[tables[b]].reshape(-1, 2, d)[:c]
        vals = v_cache[tables[b]].reshape(-1, 2, d)[:c]
        ref = _naive_attention(q[b : b + 1], keys, vals, d**-0.5)[0]
        torch.testing.assert_close(out[b].double(), ref, rtol=1e-5, atol=1e-5)
    k_cache[0].fill_(1e4)  # block 0 is only ever padding here: poisoning it changes nothing
    v_cache[0].fill_(1e4)
    assert torch.equal(ops.decode_attention(q, k_cache, v_cache, tables, context, d**-0.5, 19), out)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq, d", [(4, 64), (2, 16), (6, 128), (2, 8)])
def test_prefill_attention_attends_each_segment_causally(hq, d, cache_dtype, ops):
    """Several sequences' multi-row segments in one batch, each row over its sequence's prefix and
    the rows before it (the C kernel's tiles: tests/layers/test_attention_prefill.py)."""
    k_cache, v_cache = (c.to(cache_dtype) for c in _paged_cache(num_blocks=12, d=d))
    tables = torch.tensor([[3, 7, 1, 0], [5, 0, 0, 0], [2, 4, 6, 8], [9, 10, 11, 0]])
    # (row_start, row_end, sequence, context_len): a chunk after a cached prefix, a whole prompt,
    # a longer segment and a two-row one
    segments = ((0, 5, 0, 11), (5, 9, 1, 4), (9, 18, 2, 14), (18, 20, 3, 12))
    q = randn(21, hq + 1, d)[:, :hq]  # a strided view; row 20 is a decode row, not ours
    out = torch.full((21, hq, d), 7.0)
    ops.prefill_attention(out, q, k_cache, v_cache, tables, segments, d**-0.5)
    for start, end, seq, context in segments:
        keys = k_cache[tables[seq]].reshape(-1, 2, d)[:context]
        vals = v_cache[tables[seq]].reshape(-1, 2, d)[:context]
        ref = _naive_attention(q[start:end], keys, vals, d**-0.5)
        torch.testing.assert_close(out[start:end].double(), ref, rtol=1e-5, atol=1e-5)
    assert (out[20] == 7.0).all()  # rows outside the segments are left alone


@pytest.mark.parametrize("hq, dtype", [(2, torch.float32), (8, torch.float32), (8, torch.bfloat16)])
def test_gathered_decode_attention_equals_the_paged_oracle(hq, dtype, native_ops):
    """The CPU decode path (slots and mask built once per forward) attends exactly the context
    of each sequence: block-table padding and positions past a context never leak in."""
    k_cache, v_cache = (c.to(dtype) for c in _paged_cache())
    tables = torch.tensor([[7, 2, 9, 0], [4, 0, 0, 0], [1, 3, 5, 8]])
    context = torch.tensor([9, 4, 16])
    q = randn(3, hq, 8, dtype=dtype)
    gather = DecodeGather.build(tables, context, 16, block_size=4)
    assert gather.slots.shape == (3 * 16,) and gather.mask.shape == (3, 1, 1, 16)
    assert gather.mask.sum().item() == 9 + 4 + 16
    out = attend_decode_gathered(q, k_cache, v_cache, gather, 8**-0.5)
    ref = native_ops.decode_attention(q, k_cache, v_cache, tables, context, 8**-0.5, 16)
    assert out.dtype == dtype and out.shape == q.shape
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    k_cache[0].fill_(1e4)  # block 0 is only ever padding here: poisoning it changes nothing
    torch.testing.assert_close(attend_decode_gathered(q, k_cache, v_cache, gather, 8**-0.5), out)


def test_apply_rope_is_bit_identical_to_the_rotate_half_form():
    x = randn(5, 3, 16)
    cos, sin = rope_cos_sin(torch.tensor([0, 3, 9, 100, 2047]), rope_inv_freq(16, 1e4), torch.float32)
    rotate_half = torch.cat((-x[..., 8:], x[..., :8]), dim=-1)
    assert torch.equal(apply_rope(x, cos, sin), x * cos[:, None] + rotate_half * sin[:, None])


def test_prefill_attention_attends_to_prefix_and_causal_rows():
    k_cache, v_cache = _paged_cache()
    table = torch.tensor([6, 1, 8, 0])
    q = randn(5, 4, 8)  # the last 5 of 11 positions: 6 cached before this chunk
    out = prefill_attention(q, k_cache, v_cache, table, 11, 8**-0.5)
    keys = k_cache[table].reshape(-1, 2, 8)[:11]
    vals = v_cache[table].reshape(-1, 2, 8)[:11]
    torch.testing.assert_close(out.double(), _naive_attention(q, keys, vals, 8**-0.5), rtol=1e-5, atol=1e-5)


def test_qk_rope_same_for_split_views_and_for_each_new_sin_table(native_ops):
    """q/k split from one fused projection are rotated through one view (no concatenation), and
    the signed sin table memo follows the table it is given, call after call."""
    from metrale_core.layers.op_support import adjacent_heads as _adjacent_heads

    op = native_ops.qk_norm_rope
    fused = randn(4, (6 + 2 + 2) * 8)
    q, k, _ = fused.split([48, 16, 16], dim=-1)
    q, k = q.view(4, 6, 8), k.view(4, 2, 8)
    assert _adjacent_heads(q, k) is not None and _adjacent_heads(k, q) is None
    assert _adjacent_heads(q.contiguous(), k.contiguous()) is None
    for start in (0, 17, 300):  # a new sin table each call
        cos, sin = rope_cos_sin(torch.arange(start, start + 4), rope_inv_freq(8, 1e4), torch.float32)
        got_q, got_k = op(q, k, None, None, cos, sin, 1e-6)
        assert torch.equal(got_q, apply_rope(q.contiguous(), cos, sin))
        assert torch.equal(got_k, apply_rope(k.contiguous(), cos, sin))
