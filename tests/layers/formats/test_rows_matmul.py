"""``RowsMatmul`` (metrale_core.layers.formats.rows_matmul): the batch-invariant small dense product of
an MoE router, on the torch path and on each C variant this CPU runs (AVX512 and AVX2 here)."""

from __future__ import annotations

import pytest
import torch

from metrale_core.layers.blocks.moe import RowwiseLinear
from metrale_core.layers.formats.rows_matmul import RowsMatmul
from metrale_core.testing.requires import cpu_isa_params, use_kernel_path


@pytest.fixture
def op(kernel_path) -> RowsMatmul:
    return RowsMatmul("cpu")


@pytest.mark.parametrize(("n", "k"), [(128, 2048), (7, 33), (4, 16), (5, 1000), (1, 8)])
def test_each_row_is_the_product_and_the_same_bits_alone_as_in_a_batch(op, n, k):
    g = torch.Generator().manual_seed(n * 1000 + k)
    w, x = torch.randn(n, k, generator=g), torch.randn(19, k, generator=g)
    out = op(x, w)
    assert out.shape == (19, n)
    assert torch.allclose(out, x.double().matmul(w.double().T).float(), rtol=1e-5, atol=1e-4 * k**0.5)
    for i in (0, 7, 18):  # alone, and at another place in a smaller batch
        assert torch.equal(op(x[i : i + 1], w), out[i : i + 1])
        assert torch.equal(op(x[i:], w)[0], out[i])


def test_strided_rows_and_an_empty_batch(op):
    g = torch.Generator().manual_seed(3)
    w, wide = torch.randn(6, 40, generator=g), torch.randn(5, 64, generator=g)
    x = wide[:, :40]  # rows with a stride of 64
    assert torch.equal(op(x, w), op(x.contiguous(), w))
    assert op(x[:0], w).shape == (0, 6)


def test_the_c_path_runs_where_the_cpu_has_kernels(monkeypatch):
    isa = cpu_isa_params()[0]
    use_kernel_path(monkeypatch, f"cpu-{isa}", "metrale_core.layers")
    op = RowsMatmul("cpu")
    assert op.path == "cpu"
    x, w = torch.randn(3, 32), torch.randn(5, 32)
    assert torch.allclose(op(x, w), op.forward_native(x, w), atol=1e-5)


def test_rowwise_linear_is_the_router_product_plus_its_bias():
    g = torch.Generator().manual_seed(6)
    w, b, x = torch.randn(4, 8, generator=g), torch.randn(4, generator=g), torch.randn(3, 8, generator=g)
    assert torch.allclose(RowwiseLinear(w, b)(x), x @ w.T + b, atol=1e-5)
    assert torch.equal(RowwiseLinear(w)(x[1:2]), RowwiseLinear(w)(x)[1:2])
