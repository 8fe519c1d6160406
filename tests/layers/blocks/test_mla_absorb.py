"""MLA's per-head absorption products on the C kernel (``kernels/cpu/mla_absorb.c``): einsum's
values to float rounding, and every row the same bits whatever the rows around it -- the
batch invariance the ``rowwise`` path of ``layers.mla`` promises, without a per-row loop."""

from __future__ import annotations

import pytest
import torch

from metrale_core.layers.blocks import mla
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa

T, H, K_UK, R = 13, 3, 24, 40  # rows (not a multiple of the kernel's row group), heads, dims


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, K_UK + 8, generator=gen)[..., :K_UK]  # strided: a view of q's no-rope part
    lat = torch.randn(T, H, R + 8, generator=gen)[..., :R]
    w_uk = torch.randn(H, K_UK, R, generator=gen)
    w_uv = torch.randn(H, 20, R, generator=gen)
    return q, lat, w_uk, w_uv


@pytest.mark.parametrize("isa", cpu_isa_params())
def test_the_kernel_matches_einsum_and_every_row_is_batch_invariant(isa, monkeypatch):
    use_cpu_isa(monkeypatch, isa, mla.PACKAGE)
    assert mla.mla_kernel() is not None
    q, lat, w_uk, w_uv = _inputs(0)
    for x, w, equation in ((q, w_uk, mla._UK), (lat, w_uv, mla._UV)):
        ours = mla._per_head(x, w, equation, rowwise=True)
        assert torch.allclose(ours, torch.einsum(equation, x, w), rtol=1e-5, atol=1e-5)
        for t in (0, 5, T - 1):  # alone, and as the first row of a shorter batch
            assert torch.equal(mla._per_head(x[t : t + 1], w, equation, rowwise=True)[0], ours[t])
            assert torch.equal(mla._per_head(x[t:], w, equation, rowwise=True)[0], ours[t])
