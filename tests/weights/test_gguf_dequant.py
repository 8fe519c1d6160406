"""Our numpy dequantizers against gguf.quants (bit-exact) and against the original values."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from metrale_core.weights.gguf_dequant import NATIVE_TYPES, dequantize, qtype_of, tensor_nbytes

Q = gguf.GGMLQuantizationType

# max |dequant - original| / max |original| per row-block, generous but far below a wrong decode
_REL_TOL = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 1e-2, "Q4_0": 0.16, "Q4_1": 0.08, "MXFP4": 0.25}


def _sample(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    x *= rng.uniform(0.01, 3.0, size=shape[:-1] + (1,)).astype(np.float32)  # per-row scales
    x[..., :32] += 0.5  # a shifted block, so Q4_1's minimum matters
    return x


@pytest.mark.parametrize("name", sorted(NATIVE_TYPES))
def test_native_types_match_gguf_and_original(name: str) -> None:
    rng = np.random.default_rng(1)
    original = _sample(rng, (6, 4, 96))
    data = gguf.quants.quantize(original, Q[name])
    ours = dequantize(data, name, original.shape)
    assert ours.dtype == np.float32 and ours.shape == original.shape and ours.flags.c_contiguous
    reference = gguf.quants.dequantize(data, Q[name]).astype(np.float32).reshape(original.shape)
    np.testing.assert_array_equal(ours, reference)
    err = np.abs(ours - original).max() / np.abs(original).max()
    assert err <= _REL_TOL[name], f"{name}: relative error {err}"
    if name != "F32":
        assert err > 0  # really quantized: the test would notice a pass-through


def test_q4_1_block_layout_by_hand() -> None:
    # one block: d=0.5, m=-1, element j has code j % 16 (low nibbles) and 15 - j % 16 (high)
    codes_lo = np.arange(16, dtype=np.uint8)
    codes_hi = 15 - codes_lo
    block = np.concatenate(
        [np.array([0.5], "<f2").view(np.uint8), np.array([-1.0], "<f2").view(np.uint8), codes_lo | (codes_hi << 4)]
    )
    out = dequantize(block, "Q4_1", (32,))
    expected = np.concatenate([codes_lo, codes_hi]).astype(np.float32) * 0.5 - 1.0
    np.testing.assert_array_equal(out, expected)


def test_q8_0_and_q4_0_block_layout_by_hand() -> None:
    q = np.arange(-16, 16, dtype=np.int8)
    block = np.concatenate([np.array([0.25], "<f2").view(np.uint8), q.view(np.uint8)])
    np.testing.assert_array_equal(dequantize(block, "Q8_0", (32,)), q.astype(np.float32) * 0.25)
    nib = np.arange(16, dtype=np.uint8)
    block = np.concatenate([np.array([2.0], "<f2").view(np.uint8), nib | (nib << 4)])
    expected = (np.concatenate([nib, nib]).astype(np.float32) - 8) * 2.0
    np.testing.assert_array_equal(dequantize(block, "Q4_0", (32,)), expected)


@pytest.mark.parametrize("name,scale_bytes", [("Q4_K", (0, 2)), ("Q6_K", (208,)), ("Q5_0", (0,))])
def test_other_types_fall_back_to_gguf(name: str, scale_bytes: tuple[int, ...]) -> None:
    rng = np.random.default_rng(2)
    block_size, type_size = gguf.GGML_QUANT_SIZES[Q[name]]
    rows, cols = 3, 2 * block_size
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    for at in scale_bytes:  # finite f16 scales instead of random bit patterns (NaN/inf)
        blocks[:, at : at + 2] = rng.uniform(-1, 1, (blocks.shape[0], 1)).astype("<f2").view(np.uint8)
    raw = blocks.reshape(rows, -1)
    ours = dequantize(raw, name, (rows, cols))
    reference = gguf.quants.dequantize(raw, Q[name])
    assert ours.shape == (rows, cols) and np.isfinite(ours).all()
    np.testing.assert_array_equal(ours, reference)


def test_result_never_aliases_input() -> None:
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    out = dequantize(x, "F32", (2, 32))
    np.testing.assert_array_equal(out, x)
    assert not np.shares_memory(out, x)


def test_size_and_type_checks() -> None:
    assert tensor_nbytes("Q4_1", (576, 576)) == 576 * 576 // 32 * 20
    assert tensor_nbytes(Q.F16, (3, 5)) == 30
    assert qtype_of("q8_0") is Q.Q8_0 and qtype_of(3) is Q.Q4_1
    with pytest.raises(ValueError, match="not a multiple of the Q8_0 block size 32"):
        tensor_nbytes("Q8_0", (4, 40))
    with pytest.raises(ValueError, match="needs 68 bytes, got 34"):
        dequantize(np.zeros(34, np.uint8), "Q8_0", (64,))
    with pytest.raises(ValueError, match="unknown GGML type name 'Q9_9'"):
        qtype_of("Q9_9")
