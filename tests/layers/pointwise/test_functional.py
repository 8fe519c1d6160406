"""``metrale_core.layers``: the oracles the model plugins now share, against transformers' own
definitions, and the RMSNorm cast orders kept apart (the MTP head's differs from the decoders')."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from metrale_core.api import ConfigError, Embedding, GeGLU, geglu, rms_norm, swiglu, torch_dtype
from metrale_core.layers import DTYPES


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_is_hf_llama_rmsnorm(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 64).to(dtype)
    norm = LlamaRMSNorm(64, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    assert torch.equal(rms_norm(x, norm.weight.data, 1e-6), norm(x).detach())


def test_rms_norm_cast_orders_differ_only_across_dtypes():
    torch.manual_seed(1)
    x32 = torch.randn(4, 32)
    w32 = torch.randn(32)
    x16, w16 = x32.bfloat16(), w32.bfloat16()
    # same dtype: the two cast orders are the same numbers
    assert torch.equal(rms_norm(x16, w16, 1e-6), rms_norm(x16, w16, 1e-6, cast="weight"))
    # bfloat16 input, float32 weight: "input" rounds the normalised x to bfloat16 first
    normed = x16.float() * torch.rsqrt(x16.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(rms_norm(x16, w32, 1e-6), w32 * normed.to(torch.bfloat16))
    assert torch.equal(rms_norm(x16, w32, 1e-6, cast="weight"), normed * w32)
    assert not torch.equal(rms_norm(x16, w32, 1e-6), rms_norm(x16, w32, 1e-6, cast="weight"))


def test_gated_mlps_match_transformers_activations():
    torch.manual_seed(2)
    gate_up = torch.randn(3, 2 * 16)
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(swiglu(gate_up), ACT2FN["silu"](gate) * up)
    assert torch.equal(geglu(gate_up), ACT2FN["gelu_pytorch_tanh"](gate) * up)
    op = GeGLU("cpu")
    assert op.path == "native" and torch.equal(op(gate_up), geglu(gate_up))


def test_embedding_op_reads_rows():
    weight = torch.arange(12.0).view(4, 3)
    op = Embedding("cpu")
    assert torch.equal(op(torch.tensor([3, 0]), weight), weight[[3, 0]])


def test_torch_dtype_is_one_table():
    assert {name: torch_dtype(name) for name in DTYPES} == DTYPES
    with pytest.raises(ConfigError, match=r"float64.*bfloat16"):
        torch_dtype("float64")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_unit_offset_is_gemmas_one_plus_w(dtype):
    """``unit_offset=True``: ``(x32 * rsqrt(mean(x32^2) + eps) * (1 + w32)).to(x.dtype)``, as HF's
    ``Gemma3RMSNorm`` (transformers is the oracle where it is installed)."""
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(5, 32, generator=g)).to(dtype)
    w = 0.5 * torch.randn(32, generator=g)
    got = rms_norm(x, w, 1e-6, unit_offset=True)
    x32 = x.float()
    want = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)).to(dtype)
    assert got.dtype == dtype
    assert (got.float() - want.float()).abs().max().item() <= (1e-6 if dtype == torch.float32 else 0.0)
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    hf = Gemma3RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(w)
    assert (got.float() - hf(x).float()).abs().max().item() <= (1e-6 if dtype == torch.float32 else 0.0)
