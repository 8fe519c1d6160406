"""The bfloat16 matmul of ``metrale_core.layers.formats.cpu_qmatmul`` (``qmatmul_bf16``) on each C
variant this CPU runs: float32 products of bfloat16 values (the torch float64 oracle), and the
same bits for a row whatever the call's other rows, row count and thread count.  (The block-
quantized matmul's tests are in plugins/metrale-qwen3/tests/test_weight_formats.py.)"""

from __future__ import annotations

import pytest
import torch

from metrale_core.kernels.cpu import cpu_flags
from metrale_core.layers.formats import cpu_qmatmul
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa


@pytest.fixture(params=cpu_isa_params())
def lib(request, monkeypatch):
    """The C library in each variant (AVX512: the AVX512-BF16 path where the CPU has it, else the
    float32 FMA one; AVX2: the FMA one)."""
    use_cpu_isa(monkeypatch, request.param, cpu_qmatmul.PACKAGE)
    lib = cpu_qmatmul.bf16_kernel()
    assert lib is not None and lib is cpu_qmatmul.kernel()
    dot = request.param == "avx512" and "avx512_bf16" in cpu_flags()
    assert cpu_qmatmul.bf16_dot(lib) == dot
    return lib


@pytest.mark.parametrize("rows", [1, 3, 4, 9])
def test_bf16_kernel_keeps_float32_products(lib, rows):
    """bfloat16 weights times bfloat16-rounded activations, summed and returned in float32."""
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(48, 96, generator=g)
    x = torch.randn(rows, 96, generator=g) * 3
    got = cpu_qmatmul.qmatmul_bf16(lib, x, cpu_qmatmul.pack_bf16(w), 48)
    want = x.bfloat16().double() @ w.bfloat16().double().T
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, got.bfloat16().float())  # not rounded to bfloat16
    with pytest.raises(ValueError, match="N % 16"):
        cpu_qmatmul.pack_bf16(torch.zeros(8, 32))


def test_activations_round_to_bfloat16_as_torch_does(lib):
    """Ties to even either way, below a tie, huge values (identity weights read the rounded inputs
    back exactly)."""
    x = torch.tensor([[1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-9), 1 + 2**-9, 3e38, -7e-39] + [0.5] * 26])
    got = cpu_qmatmul.qmatmul_bf16(lib, x, cpu_qmatmul.pack_bf16(torch.eye(32)), 32)
    assert not torch.equal(x.bfloat16().float(), x)  # the inputs do round
    assert torch.equal(got, x.bfloat16().float())


@pytest.mark.parametrize(("n", "k"), [(64, 96), (576, 1536), (1536, 576)])
def test_a_row_has_the_same_bits_in_any_batch_and_thread_count(lib, n, k):
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(64, k, generator=g) * 2
    packed = cpu_qmatmul.pack_bf16(w)
    full = cpu_qmatmul.qmatmul_bf16(lib, x, packed, n, threads=2)
    want = x.bfloat16().double() @ w.bfloat16().double().T
    torch.testing.assert_close(full.double(), want, rtol=1e-5, atol=1e-5 * k**0.5)
    assert torch.equal(cpu_qmatmul.qmatmul_bf16(lib, x, packed, n, threads=1), full)
    assert torch.equal(cpu_qmatmul.qmatmul_bf16(lib, x[:37], packed, n, threads=2), full[:37])
    for r in (0, 5, 36, 63):  # alone, and at another place in a call of another row count
        assert torch.equal(cpu_qmatmul.qmatmul_bf16(lib, x[r : r + 1], packed, n, threads=1), full[r : r + 1])
        assert torch.equal(cpu_qmatmul.qmatmul_bf16(lib, x[r:], packed, n, threads=2)[0], full[r])


def test_zero_rows_and_bad_shapes(lib):
    wb = cpu_qmatmul.pack_bf16(torch.randn(32, 64))
    assert cpu_qmatmul.qmatmul_bf16(lib, torch.empty(0, 64), wb, 32).shape == (0, 32)
    with pytest.raises(ValueError, match="cannot take"):
        cpu_qmatmul.qmatmul_bf16(lib, torch.randn(2, 48), wb, 32)  # K % 32
