"""MXFP4 blocks (GGML type 39, gpt-oss's experts) against a dequantization written from the spec.

The oracle here is the OCP Microscaling v1.0 definition, evaluated in float64: a block is one
E8M0 scale byte ``E`` (the value ``2^(E - 127)``) and 32 e2m1 codes (sign bit 3, two exponent bits,
one mantissa bit: ``0, 0.5, 1, 1.5, 2, 3, 4, 6``), element ``j`` in the low nibble of byte ``j``
and element ``j + 16`` in its high nibble (gguf-py's ``MXFP4`` layout); ``E = 255``, NaN in the
spec, is read as ``2^128`` as llama.cpp reads it.  Every code and every scale byte -- the
subnormal products of ``E`` 0 and 1 and the overflow of ``E`` 255 included -- go through the GGUF
reader's dequantizer and the block kernel's decode; the kernel (C where it builds, and the torch
fallback) multiplies matrices whose rows span scales from ``2^-127`` to ``2^73``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter

from metrale_core.layers.formats import gguf_blocks as gb
from metrale_core.layers.formats import gguf_linear as gl
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa
from metrale_core.weights.gguf_dequant import dequantize
from metrale_core.weights.gguf_store import GGUFStore

K = 256


def e2m1(code: np.ndarray) -> np.ndarray:
    """The OCP e2m1 value of 4-bit ``code`` (float64)."""
    sign = np.where(code & 8, -1.0, 1.0)
    exponent, mantissa = (code >> 1) & 3, code & 1
    magnitude = np.where(exponent == 0, 0.5 * mantissa, 2.0 ** (exponent.astype(np.float64) - 1) * (1 + 0.5 * mantissa))
    return sign * magnitude


def spec_dequantize(blocks: np.ndarray) -> np.ndarray:
    """``[n, 17]`` MXFP4 blocks -> ``[n, 32]`` values, float64 (module docstring)."""
    scale = np.ldexp(1.0, blocks[:, 0].astype(np.int64) - 127)[:, None]
    codes = np.concatenate([blocks[:, 1:] & 0x0F, blocks[:, 1:] >> 4], axis=1)
    return scale * e2m1(codes)


def every_code_and_scale() -> np.ndarray:
    """256 blocks, block ``e`` with scale byte ``e``, together holding every code at every scale."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(256, 17), dtype=np.uint8)
    blocks[:, 0] = np.arange(256)
    blocks[:, 1:9] = np.arange(16, dtype=np.uint8)[:8] | (np.arange(16, dtype=np.uint8)[8:] << 4)  # codes 0..15
    return blocks


def test_the_e2m1_table_is_the_spec():
    assert e2m1(np.arange(8)).tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert e2m1(np.arange(8, 16)).tolist() == [-0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def test_the_dequantizer_is_the_spec_at_every_scale():
    blocks = every_code_and_scale()
    with np.errstate(over="ignore"):
        expected = spec_dequantize(blocks).astype(np.float32)  # E = 255: 2^128 * 1.5 overflows, as in float32
    ours = dequantize(blocks, "MXFP4", (256, 32))
    np.testing.assert_array_equal(ours, expected)
    assert ours[0, 1] == np.float32(2.0**-128) and ours[0, 1] > 0  # subnormal, exact
    assert np.isinf(ours[255]).any() and ours[255, 1] == np.float32(2.0**127)


def test_the_kernel_decode_is_the_spec_at_every_scale():
    blocks = every_code_and_scale()
    kind, codes, d, m = gb.decode(blocks.reshape(8, 32, 17), "MXFP4")
    assert kind == gb.K_S8_32 and m is None
    with np.errstate(over="ignore"):
        ours = codes.astype(np.float32).reshape(8, 32, 32) * d[..., None]
        expected = spec_dequantize(blocks).astype(np.float32)
    np.testing.assert_array_equal(ours.reshape(256, 32), expected)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory):
    """A ``[32, K]`` MXFP4 tensor read back through the GGUF store: row ``r``'s blocks have scale
    bytes around ``SCALES[r % 8]`` (from subnormal products to ``2^73``)."""
    rng = np.random.default_rng(1)
    scales = np.array([0, 1, 2, 64, 120, 127, 160, 200])
    blocks = rng.integers(0, 256, size=(32, K // 32, 17), dtype=np.uint8)
    base = scales[np.arange(32) % 8][:, None]
    blocks[..., 0] = np.clip(base + rng.integers(0, 3, size=(32, K // 32)), 0, 254)
    path = tmp_path_factory.mktemp("mxfp4") / "mxfp4.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_embedding_length(K)
    writer.add_head_count(8)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_tensor("blk.0.ffn_down.weight", blocks.reshape(32, -1), raw_dtype=GGMLQuantizationType.MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    raw = GGUFStore(path).get_raw("model.layers.0.mlp.down_proj.weight")
    assert raw.quant_type == "MXFP4" and raw.shape == (32, K)
    return raw, spec_dequantize(blocks.reshape(-1, 17)).reshape(32, K)


def _assert_rows_near(y: torch.Tensor, x: torch.Tensor, w: np.ndarray) -> None:
    """Each row of ``y = x @ w.T`` within 1e-3 of its own largest float64 value (15-bit activations),
    plus the float32 subnormal spacing for the rows of scale ``2^-127``."""
    exact = x.double().numpy() @ w.T
    err = np.abs(y.double().numpy() - exact)
    bound = 1e-3 * np.abs(exact).max(axis=0, keepdims=True) + 2.0**-140
    assert np.isfinite(y.numpy()).all() and (err <= bound).all()


@pytest.mark.parametrize("isa", cpu_isa_params())
def test_the_c_kernel_multiplies_mxfp4_as_the_spec(matrix, isa: str, monkeypatch: pytest.MonkeyPatch):
    use_cpu_isa(monkeypatch, isa, gl.PACKAGE)
    raw, w = matrix
    lin = gl.gguf_linear([raw])
    assert lin.kernel is not None
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(2))
    y = lin(x)
    _assert_rows_near(y, x, w)
    assert torch.equal(y[3:4], lin(x[3:4]))  # batch-invariant


def test_the_torch_fallback_multiplies_mxfp4_as_the_spec(matrix, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("METRALE_KERNELS", "native")
    raw, w = matrix
    lin = gl.gguf_linear([raw])
    assert lin.kernel is None
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(3))
    _assert_rows_near(lin(x), x, w)
