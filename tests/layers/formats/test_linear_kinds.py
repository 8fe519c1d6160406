"""The bfloat16 layers of ``metrale_core.layers.formats.linear_kinds``: ``bf16_linear`` (the bf16
format's projections) and the quantized formats' batch copy run the C kernel on each variant this
CPU runs, so a row's result is the same bits alone, in a batch of 37 or 64 rows and at 1 or 2
threads; where the kernel cannot take a shape, torch's bfloat16 matmul remains.  (The codes'
paths are tested in plugins/metrale-qwen3/tests/test_weight_formats.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrale_core.layers.formats import cpu_qmatmul
from metrale_core.layers.formats.linear_kinds import (
    BLOCK_QUANT_BATCH_ROWS,
    Bf16Linear,
    BlockQuantLinear,
    DenseLinear,
    bf16_linear,
    block_linear,
    quantize_int8,
)
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa


@pytest.fixture(params=cpu_isa_params(), autouse=True)
def isa(request, monkeypatch):
    use_cpu_isa(monkeypatch, request.param, cpu_qmatmul.PACKAGE)
    threads = torch.get_num_threads()
    yield request.param
    torch.set_num_threads(threads)


def _invariant_rows(lin, x: torch.Tensor, alone) -> torch.Tensor:
    """``lin(x)`` for 64 rows, asserted equal bit for bit to its first 37 rows' call, to every
    checked row through ``alone`` and to the same call at 1 thread; returns ``lin(x)``."""
    assert BLOCK_QUANT_BATCH_ROWS < 37 <= x.shape[0]  # a quantized layer calls its batch copy for both
    torch.set_num_threads(2)
    full = lin(x)
    assert torch.equal(lin(x[:37]), full[:37])
    torch.set_num_threads(1)
    assert torch.equal(lin(x), full)
    for r in (0, 17, 36, 63):
        assert torch.equal(alone(x[r : r + 1]), full[r : r + 1])
    return full


def _oracle(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = x.bfloat16().double() @ w.bfloat16().double().T
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bf16_projections_are_batch_and_thread_invariant(dtype):
    g = torch.Generator().manual_seed(1)
    w, bias = torch.randn(576, 1536, generator=g), torch.randn(576, generator=g).to(dtype)
    lin = bf16_linear(w.to(dtype), bias)
    assert isinstance(lin, Bf16Linear) and lin.out_features == 576
    x = torch.randn(64, 1536, generator=g).to(dtype)
    full = _invariant_rows(lin, x, lin)
    assert full.dtype == dtype
    assert torch.equal(lin(x.reshape(4, 16, 1536)), full.reshape(4, 16, 576))  # leading dimensions
    torch.testing.assert_close(full.double(), _oracle(x, w, bias), rtol=1e-2, atol=1e-2 * 1536**0.5)


def test_shapes_the_kernel_cannot_take_fall_back_to_torch_bfloat16():
    w = torch.randn(40, 64)  # N % 16 != 0
    lin = bf16_linear(w)
    assert isinstance(lin, DenseLinear) and lin.weight.dtype == torch.bfloat16
    x = torch.randn(3, 64)
    torch.testing.assert_close(lin(x), (x.bfloat16() @ w.bfloat16().T).float(), rtol=0, atol=0)


def test_int8_batch_copy_is_batch_and_thread_invariant():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(1536, 576, generator=g)
    lin = quantize_int8(w, batch_copy=True)
    assert isinstance(lin, BlockQuantLinear) and isinstance(lin.batch, Bf16Linear)
    x = torch.randn(64, 576, generator=g)
    full = _invariant_rows(lin, x, lin.batch)
    torch.testing.assert_close(full.double(), _oracle(x, w), rtol=1e-4, atol=1e-4 * 576**0.5)
    assert not torch.equal(full, full.bfloat16().float())  # float32 results (logits do not tie)


def test_int4_batch_copy_is_batch_and_thread_invariant():
    """The GGUF codes' projection (``block_linear``, as ``int4_from_gguf`` builds it) with its
    dequantized matrix as the batch copy."""
    rng = np.random.default_rng(3)
    n, k = 96, 128
    codes = rng.integers(0, 16, (n, k))
    d = (rng.random((n, k // 32)) * 0.02 + 0.001).astype(np.float32)
    m = np.float32(-8.0) * d
    dense = torch.from_numpy((codes.reshape(n, -1, 32) * d[..., None] + m[..., None]).reshape(n, k).astype(np.float32))
    lin = block_linear(codes, d, m, 4, dense=dense)
    assert isinstance(lin, BlockQuantLinear) and isinstance(lin.batch, Bf16Linear)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(3))
    full = _invariant_rows(lin, x, lin.batch)
    torch.testing.assert_close(full.double(), _oracle(x, dense), rtol=1e-4, atol=1e-4 * k**0.5)
