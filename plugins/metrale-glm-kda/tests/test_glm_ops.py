"""The mHC Sinkhorn op: the in-place torch form equals transformers' out-of-place loop bit for
bit, yields doubly stochastic matrices, and (on CUDA) the kernel agrees with it."""

from __future__ import annotations

import pytest
import torch

from metrale_glm_kda.hc import sinkhorn_
from metrale_glm_kda.ops import HcSinkhorn


def _reference(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """transformers' ``Glm5NextTextHyperConnection`` loop, out of place."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


@pytest.mark.parametrize("hc", [2, 4, 8])
def test_sinkhorn_in_place_equals_reference(hc):
    comb = torch.softmax(torch.randn(7, hc, hc, generator=torch.Generator().manual_seed(hc)), -1) + 1e-6
    want = _reference(comb, 20, 1e-6)
    got = sinkhorn_(comb.clone(), 20, 1e-6)
    assert torch.equal(got, want)
    assert torch.allclose(got.sum(-2), torch.ones(7, hc), atol=1e-5)
    assert torch.allclose(got.sum(-1), torch.ones(7, hc), atol=2e-2)
    assert not torch.allclose(comb.sum(-2), torch.ones(7, hc), atol=2e-2)  # the input was not


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("hc", [2, 4, 8])
def test_sinkhorn_kernel_matches_torch(hc):
    pytest.importorskip("cupy")
    comb = torch.softmax(torch.randn(300, hc, hc, device="cuda") * 3, -1) + 1e-6
    want = sinkhorn_(comb.clone(), 20, 1e-6)
    op = HcSinkhorn("cuda")
    got = op(comb.clone(), 20, 1e-6)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
