"""``build_linear`` (metrale_core.layers.formats.linear): which layer the bfloat16 paths get -- the
``bf16`` format's projections and head, and ``auto``'s BF16 checkpoint tensors -- on each C variant
this CPU runs: the batch-invariant C kernel (``Bf16Linear``) wherever it takes the shape, torch
elsewhere (the head then in float32)."""

from __future__ import annotations

import pytest
import torch

from metrale_core.layers.formats import cpu_qmatmul
from metrale_core.layers.formats.linear import build_linear
from metrale_core.layers.formats.linear_kinds import Bf16Linear, DenseLinear
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa


class _Store:
    """A safetensors checkpoint of BF16 tensors."""

    format = "safetensors"

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def get(self, name, *, dtype=torch.float32, shape=None):
        assert shape is None or tuple(self.tensors[name].shape) == tuple(shape)
        return self.tensors[name].to(dtype)

    def shape(self, name):
        return tuple(self.tensors[name].shape)

    def quant_type(self, name):
        return "BF16"


@pytest.fixture(params=cpu_isa_params(), autouse=True)
def isa(request, monkeypatch):
    use_cpu_isa(monkeypatch, request.param, cpu_qmatmul.PACKAGE)
    return request.param


@pytest.mark.parametrize("fmt", ["bf16", "auto"])
@pytest.mark.parametrize("rows", [48, 40])
def test_bfloat16_projections_run_the_invariant_kernel_where_it_takes_the_shape(fmt, rows):
    w = torch.randn(rows, 64).bfloat16()
    store = _Store({"p.weight": w})
    lin = build_linear(store, ["p.weight"], [(rows, 64)], fmt, torch.float32, "cpu")
    x = torch.randn(5, 64)
    want = x.bfloat16().double() @ w.double().T
    if rows % 16 == 0:
        assert isinstance(lin, Bf16Linear)
        torch.testing.assert_close(lin(x).double(), want, rtol=1e-5, atol=1e-5)
    else:  # torch's bfloat16 matmul (results rounded to bfloat16)
        assert isinstance(lin, DenseLinear) and lin.weight.dtype == torch.bfloat16
        torch.testing.assert_close(lin(x).double(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("fmt", ["bf16", "auto"])
@pytest.mark.parametrize("rows", [48, 40])
def test_the_head_keeps_float32_logits(fmt, rows):
    w = torch.randn(rows, 64).bfloat16()
    store = _Store({"head.weight": w})
    head = build_linear(store, ["head.weight"], [(rows, 64)], fmt, torch.float32, "cpu", output_head=True)
    if fmt == "bf16" and rows % 16 == 0:
        assert isinstance(head, Bf16Linear)
    else:  # auto: the bfloat16 values times the float32 activations
        assert isinstance(head, DenseLinear) and torch.equal(head.weight, w.float())
    x = torch.randn(3, 64)
    logits = head(x)
    assert logits.dtype == torch.float32 and not torch.equal(logits, logits.bfloat16().float())
