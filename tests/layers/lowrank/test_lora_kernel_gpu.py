"""The LoRA CUDA kernel (``metrale_core/layers/kernels/lora.cu``) against ``LoRAApply.forward_native``
on the same inputs (``gpu`` marker).

Proven here, for float32 on a CUDA device: ``LoRAApply`` takes the kernel path, and the kernel (not
a silent fallback to the torch path) adds to every adapter row exactly its own slot's
``x @ A.T @ B.T`` (to float32 summation-order error); base rows (slot -1) and rows of a rank-0
slot come back bit-identical; this holds with slots interleaved with base rows, a single slot,
ranks that differ per slot (zero-padded beyond the rank, as ``LoRALinear.set_slot`` stores them),
one row and 64 rows, and sizes that are no multiple of the launch block.
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

#: float32 tolerance, relative to the output's scale (the kernel sums in another order than cuBLAS).
TOL = 1e-4

#: name -> (rows T, in K, out N, slot ranks (stack width = max), per-row slots (-1 = base)).
CASES = {
    "interleaved_T64": (64, 2048, 1024, [16, 16, 16, 16], [(i % 5) - 1 for i in range(64)]),
    "interleaved_T64_4096": (64, 4096, 4096, [16, 16, 16, 16], [(i % 5) - 1 for i in range(64)]),
    "single_slot_T1": (1, 512, 384, [8, 8, 8], [2]),
    "single_slot_T64": (64, 1000, 700, [12], [0] * 64),
    "ranks_differ_T64": (64, 768, 320, [16, 4, 0, 9], [(i * 7) % 5 - 1 for i in range(64)]),
    "ranks_differ_T1": (1, 129, 130, [3, 7], [1]),
}


def _inputs(t, k, n, ranks, seed):
    """``y [T, N]``, ``x [T, K]``, ``A [S, R, K]``, ``B [S, N, R]`` on CUDA, each slot zero beyond its rank."""
    gen = torch.Generator().manual_seed(seed)
    width = max(max(ranks), 1)
    s = len(ranks)
    y = torch.randn(t, n, generator=gen)
    x = torch.randn(t, k, generator=gen)
    a = torch.randn(s, width, k, generator=gen) * k**-0.5
    b = torch.randn(s, n, width, generator=gen) * width**-0.5
    for slot, r in enumerate(ranks):
        a[slot, r:] = 0.0
        b[slot, :, r:] = 0.0
    return y.cuda(), x.cuda(), a.cuda(), b.cuda()


def _kernel_only(op, *args):
    """Call ``op`` with its torch path disabled, so a fallback inside ``forward_cuda`` fails the test."""

    def no_fallback(*_a, **_k):
        raise AssertionError(f"{op!r} fell back to forward_native")

    op.forward_native = no_fallback
    try:
        return op(*args)
    finally:
        del op.forward_native


@pytest.mark.parametrize("case", CASES)
def test_lora_kernel_matches_native(case):
    from metrale_core.layers.lowrank.lora import LoRAApply, LoRARows

    t, k, n, ranks, slots = CASES[case]
    assert len(slots) == t
    op = LoRAApply("cuda")
    assert op.path == "cuda"
    y0, x, a, b = _inputs(t, k, n, ranks, seed=sum(map(ord, case)))
    rows = LoRARows.from_slots(slots, device="cuda")
    assert rows is not None

    want = op.forward_native(y0.clone(), x, rows, a, b, ranks)
    y = y0.clone()
    got = _kernel_only(op, y, x, rows, a, b, ranks)
    torch.cuda.synchronize()
    assert got.data_ptr() == y.data_ptr(), "the kernel adds in place on y"

    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL * scale)

    slot_of = torch.tensor(slots, device="cuda")
    untouched = (slot_of < 0) | torch.tensor([ranks[s] == 0 if s >= 0 else True for s in slots], device="cuda")
    assert torch.equal(got[untouched], y0[untouched]), "base rows and rank-0 slots must be left bit-identical"
    adapted = ~untouched
    assert adapted.any()
    # the adapters really change their rows (so the comparison above is not between two copies of y0)
    assert (want[adapted] - y0[adapted]).abs().max().item() > 0.1
