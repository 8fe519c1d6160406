"""GGUF block formats (metrale_core.layers.formats.gguf_blocks): decoding every block type is
exact against ``gguf.quants.dequantize``, and the records are the size the kernel expects."""

from __future__ import annotations

import numpy as np
import pytest

from metrale_core.layers.formats import gguf_blocks as gb
from metrale_core.testing.gguf_blocks import dequantized, raw_of, write_block_types
from metrale_core.weights.gguf_store import GGUFStore

TYPES = list(gb.GGUF_KINDS)
N, K = 48, 512  # two K-quant super-blocks; three channel tiles


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GGUFStore:
    return write_block_types(tmp_path_factory.mktemp("gguf") / "blocks.gguf", TYPES, N, K)


def _blocks(r) -> np.ndarray:
    """``r``'s bytes as ``[N, blocks per row, block bytes]``."""
    _, per_block, size = gb.GGUF_KINDS[r.quant_type]
    return np.asarray(r.data).reshape(N, -1).view(np.uint8).reshape(N, K // per_block, size)


@pytest.mark.parametrize("t", TYPES)
def test_decode_reproduces_gguf_dequantize(store: GGUFStore, t: str) -> None:
    r = raw_of(store, t)
    _, codes, d, m = gb.decode(_blocks(r), t)
    sub = K // d.shape[1]
    w = codes.astype(np.float32).reshape(N, -1, sub) * d[..., None]
    if m is not None:
        w = w + m[..., None]
    np.testing.assert_array_equal(w.reshape(N, K), dequantized(r))


@pytest.mark.parametrize("quant_type", sorted(gb.GGUF_KINDS))
def test_records_nbytes_is_what_pack_writes(quant_type):
    kind, per_block, size = gb.GGUF_KINDS[quant_type]
    k = 256
    blocks = np.random.default_rng(1).integers(0, 256, size=(16, k // per_block, size), dtype=np.uint8)
    with np.errstate(invalid="ignore"):  # random bytes: some fp16 scales are NaN (sizes only matter)
        _, codes, d, m = gb.decode(blocks, quant_type)
    assert gb.pack(kind, codes, d, m).nbytes == gb.records_nbytes(kind, 16, k)
