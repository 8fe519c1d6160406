"""Repacking GGUF tensors (metrale_core.layers.formats.gguf_repack): fused tensors and small row
chunks give the same records as one piece, and widened types warn with their memory cost."""

from __future__ import annotations

import pytest
import torch

from metrale_core.layers.formats import gguf_blocks as gb
from metrale_core.layers.formats import gguf_linear as gl
from metrale_core.layers.formats import gguf_repack as gr
from metrale_core.testing.gguf_blocks import raw_of, write_block_types
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa
from metrale_core.weights.gguf_store import GGUFStore

N, K = 48, 512


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GGUFStore:
    return write_block_types(tmp_path_factory.mktemp("gguf") / "blocks.gguf", list(gb.GGUF_KINDS), N, K)


@pytest.mark.parametrize("isa", cpu_isa_params())
def test_fused_rows_and_small_repack_chunks(store: GGUFStore, isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tensors fused along rows, repacked in chunks of 16 rows, equal the parts side by side."""
    use_cpu_isa(monkeypatch, isa, gl.PACKAGE)
    monkeypatch.setattr(gr, "REPACK_ROWS", 16)
    a, b = raw_of(store, "Q4_K"), raw_of(store, "Q4_K")
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(5))
    fused = gl.gguf_linear([a, b])(x)
    one = gl.gguf_linear([a])(x)
    assert torch.equal(fused, torch.cat([one, one], dim=1))


def test_q2k_q3k_repack_warns(store: GGUFStore) -> None:
    from loguru import logger

    seen: list[str] = []
    sink = logger.add(lambda msg: seen.append(str(msg)), level="WARNING")
    gr._warned.clear()
    try:
        gl.gguf_linear([raw_of(store, "Q2_K")])
        gl.gguf_linear([raw_of(store, "Q3_K")])
    finally:
        logger.remove(sink)
    assert any("Q2_K" in s and "bytes per weight" in s for s in seen)
    assert any("Q3_K" in s and "bytes per weight" in s for s in seen)
