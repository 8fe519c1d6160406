"""The GLM-5.3 CuPy kernels (``kda_decode.cu``, ``short_conv.cu``, ``moe_routing.cu``) against their
ops' ``forward_native`` on the same inputs (``gpu`` marker).

Proven here, on a CUDA device, with the kernel actually launched (a fallback to the torch path
inside ``forward_cuda`` fails the test), each path on its own fresh copy of the in-place state:
- ``KdaDecodeStep`` (float32 and bfloat16 activations): the output and the whole state pool agree
  to float32 rounding; only the sequences' slots change, the others stay bit-identical.
- ``ShortConvUpdate`` (float32 and bfloat16): the output agrees to float32 rounding (float32) or
  two bf16 ulps (bfloat16); the shifted conv state is bit-identical, the other slots untouched.
- ``MoeRouting``: the chosen experts are equal, in the same order; the weights agree to float32
  rounding, with and without renormalisation, for expert counts up to the kernel's 1024.
"""

from __future__ import annotations

import pytest
import torch

from metrale_core.kernels import cupy_unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(cupy_unavailable_reason() is not None, reason=str(cupy_unavailable_reason())),
]

DTYPES = [torch.float32, torch.bfloat16]
#: float32 outputs (KDA always, the others in float32): float32 rounding of reductions summed in
#: another order.
F32_TOL = 2e-5
#: bfloat16 outputs: two ulps (an ulp is at most 2**-7 of the value) plus a small floor near zero.
BF16_RTOL, BF16_ATOL = 2.0**-6, 1e-4


def _gen(*key):
    return torch.Generator().manual_seed(sum(map(ord, repr(key))))


def _randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype).cuda()


def _slots(gen, bsz, num_slots):
    return torch.randperm(num_slots, generator=gen)[:bsz].cuda()


def _kernel_only(op, *args):
    """Call ``op`` with its torch path disabled, so a fallback inside ``forward_cuda`` fails the test."""

    def no_fallback(*_a, **_k):
        raise AssertionError(f"{op!r} fell back to forward_native")

    op.forward_native = no_fallback
    try:
        out = op(*args)
    finally:
        del op.forward_native
    torch.cuda.synchronize()
    return out


def _assert_only_slots_changed(after, before, slots):
    other = torch.ones(before.shape[0], dtype=torch.bool, device=before.device)
    other[slots] = False
    assert torch.equal(after[other], before[other]), "slots outside the batch must stay untouched"
    assert not torch.equal(after[slots], before[slots]), "the batch's slots must be updated"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "bsz,heads,dk,dv,num_slots", [(32, 16, 128, 128, 64), (3, 2, 256, 100, 5), (1, 3, 32, 1024, 2)]
)
def test_kda_decode_kernel(dtype, bsz, heads, dk, dv, num_slots):
    from metrale_glm_kda.ops import KdaDecodeStep

    op = KdaDecodeStep("cuda")
    assert op.path == "cuda"
    gen = _gen("kda", dtype, bsz, heads, dk, dv)
    q, k = _randn(gen, bsz, heads, dk, dtype=dtype), _randn(gen, bsz, heads, dk, dtype=dtype)
    v = _randn(gen, bsz, heads, dv, dtype=dtype)
    g = (-torch.rand(bsz, heads, dk, generator=gen) * 0.2).cuda()
    beta = torch.rand(bsz, heads, generator=gen).cuda()
    pool = _randn(gen, num_slots, heads, dk, dv, scale=0.1)
    slots = _slots(gen, bsz, num_slots)

    pool_native, pool_kernel = pool.clone(), pool.clone()
    want = op.forward_native(q, k, v, g, beta, pool_native, slots)
    got = _kernel_only(op, q, k, v, g, beta, pool_kernel, slots)

    assert got.dtype == torch.float32 and got.shape == (bsz, heads, dv)
    torch.testing.assert_close(got, want, rtol=F32_TOL, atol=F32_TOL)
    torch.testing.assert_close(pool_kernel, pool_native, rtol=F32_TOL, atol=F32_TOL)
    _assert_only_slots_changed(pool_kernel, pool, slots)
    assert want.abs().max().item() > 1e-2  # a real output, not two zero tensors


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bsz,channels,width,num_slots", [(32, 4096, 4, 64), (5, 300, 2, 7), (2, 257, 8, 3)])
def test_short_conv_update_kernel(dtype, bsz, channels, width, num_slots):
    from metrale_glm_kda.ops import ShortConvUpdate

    op = ShortConvUpdate("cuda")
    assert op.path == "cuda"
    gen = _gen("conv", dtype, bsz, channels, width)
    x = _randn(gen, bsz, channels, dtype=dtype)
    pool = _randn(gen, num_slots, channels, width - 1, dtype=dtype)
    weight = _randn(gen, channels, width, scale=0.5)
    slots = _slots(gen, bsz, num_slots)

    pool_native, pool_kernel = pool.clone(), pool.clone()
    want = op.forward_native(x, pool_native, weight, slots)
    got = _kernel_only(op, x, pool_kernel, weight, slots)

    assert got.dtype == dtype and got.shape == (bsz, channels)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=F32_TOL, atol=F32_TOL)
    else:
        torch.testing.assert_close(got, want, rtol=BF16_RTOL, atol=BF16_ATOL)
    assert torch.equal(pool_kernel, pool_native), "the conv state is a shift of stored inputs: exact"
    assert torch.equal(pool_kernel[slots, :, -1], x), "the newest input ends the window"
    _assert_only_slots_changed(pool_kernel, pool, slots)


@pytest.mark.parametrize(
    "rows,experts,top_k,norm,scaling",
    [(64, 256, 8, True, 2.5), (7, 72, 6, False, 1.0), (3, 1024, 32, True, 1.0), (1, 16, 1, True, 0.5)],
)
def test_moe_routing_kernel(rows, experts, top_k, norm, scaling):
    from metrale_glm_kda.ops import MoeRouting

    op = MoeRouting("cuda", top_k=top_k, n_group=1, topk_group=1, norm_topk_prob=norm, scaling=scaling)
    assert op.path == "cuda"
    gen = _gen("moe", rows, experts, top_k)
    logits = _randn(gen, rows, experts)
    bias = _randn(gen, experts, scale=0.1)

    want_w, want_ids = op.forward_native(logits, bias)
    got_w, got_ids = _kernel_only(op, logits, bias)

    assert got_ids.dtype == torch.int64 and got_ids.shape == (rows, top_k)
    assert torch.equal(got_ids, want_ids)
    assert got_w.dtype == torch.float32 and got_w.shape == (rows, top_k)
    torch.testing.assert_close(got_w, want_w, rtol=F32_TOL, atol=F32_TOL * scaling)
    if norm:
        sums = torch.full((rows,), float(scaling), device="cuda")
        torch.testing.assert_close(got_w.sum(-1), sums, rtol=1e-5, atol=1e-5)
