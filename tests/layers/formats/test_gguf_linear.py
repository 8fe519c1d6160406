"""GGUF block projections (metrale_core.layers.formats.gguf_linear) on fixture GGUF files of every type.

The fixture tensors are random valid blocks (``metrale_core.testing.gguf_blocks``) written with
``gguf.GGUFWriter`` and read back through ``GGUFStore``.  Oracles: a float64 evaluation of the
block maths for the kernel (``gguf_blocks.reference``), and the dequantized matrix
(``gguf.quants.dequantize``) times the quantized activations for the whole product.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from metrale_core.layers.formats import gguf_blocks as gb
from metrale_core.layers.formats import gguf_linear as gl
from metrale_core.layers.formats import gguf_repack as gr
from metrale_core.testing.gguf_blocks import dequantized, raw_of, write_block_types
from metrale_core.testing.requires import cpu_isa_params, use_cpu_isa
from metrale_core.weights.gguf_store import GGUFStore

TYPES = list(gb.GGUF_KINDS)
N, K = 48, 512  # two K-quant super-blocks; three channel tiles
ROWS = [1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GGUFStore:
    return write_block_types(tmp_path_factory.mktemp("gguf") / "blocks.gguf", TYPES, N, K)


def _check(y: torch.Tensor, x: torch.Tensor, r, rep_codes, d, m, fine: bool = True) -> None:
    ref = gb.reference(x, rep_codes, d, m, fine)
    scale = ref.abs().max().item() + 1e-30
    assert (y.double() - ref).abs().max().item() <= 2e-5 * scale
    # the whole product: dequantized weights (gguf) times the quantized activations
    hi, lo, da, _ = gb.quantize_activations(x, fine=fine)
    q = 255.0 * hi.double() + lo.double() if fine else hi.double()
    xq = (q.reshape(x.shape[0], -1, 32) * da.double()[..., None]).reshape(x.shape)
    w = torch.from_numpy(dequantized(r)).double()
    full = xq @ w.T
    assert (y.double() - full).abs().max().item() <= 2e-5 * (full.abs().max().item() + 1e-30)
    if fine:  # 15-bit activations: within 1e-3 of the float product
        exact = x.double() @ w.T
        assert (y.double() - exact).abs().max().item() <= 1e-3 * (exact.abs().max().item() + 1e-30)


@pytest.mark.parametrize("isa", cpu_isa_params())
@pytest.mark.parametrize("t", TYPES)
def test_native_kernel_every_type_and_row_count(
    store: GGUFStore, t: str, isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_cpu_isa(monkeypatch, isa, gl.PACKAGE)
    r = raw_of(store, t)
    lin = gl.gguf_linear([r])
    assert lin.kernel is not None and lin.weight.records is not None
    _, codes, d, m = gb.decode(gr._blocks(r, slice(None)), t)
    codes_t = torch.from_numpy(codes.astype(np.int16))
    d_t, m_t = torch.from_numpy(d), None if m is None else torch.from_numpy(m)
    x_all = torch.randn(max(ROWS), K, generator=torch.Generator().manual_seed(1))
    alone = [lin(x_all[i : i + 1]) for i in range(max(ROWS))]
    for rows in ROWS:
        x = x_all[:rows]
        y = lin(x)
        _check(y, x, r, codes_t, d_t, m_t)
        # batch invariance: each row equals that row multiplied alone, bit for bit
        assert torch.equal(y, torch.cat(alone[:rows]))
    assert lin(x_all[:0]).shape == (0, N)  # a step with no row for this projection: R = 0 in C
    # int8 activations, as llama.cpp: as close to their own oracle, and as batch-invariant
    coarse = gl.GGUFLinear(lin.weight, lin.kernel, precision=gl.ActivationPrecision(fine=False))
    coarse_alone = [coarse(x_all[i : i + 1]) for i in range(max(ROWS))]
    for rows in (1, 5, 64):
        _check(coarse(x_all[:rows]), x_all[:rows], r, codes_t, d_t, m_t, fine=False)
        assert torch.equal(coarse(x_all[:rows]), torch.cat(coarse_alone[:rows]))


@pytest.mark.skipif(len(cpu_isa_params()) < 2, reason="the CPU runs one C variant: nothing to compare")
@pytest.mark.parametrize("t", TYPES)
def test_isa_variants_give_the_same_bits(store: GGUFStore, t: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The AVX512-VNNI tiles and the AVX2 tiles compute the same int32 dot products and the same
    float steps, so every variant gives the same bits (the test above checks each against the
    oracles; this one, that a machine's choice of variant never changes an answer)."""
    r = raw_of(store, t)
    x = torch.randn(64, K, generator=torch.Generator().manual_seed(7))
    outs = {}
    for isa in cpu_isa_params():
        use_cpu_isa(monkeypatch, isa, gl.PACKAGE)
        lin = gl.gguf_linear([r])
        assert lin.kernel is not None
        outs[isa] = [lin(x[:rows]) for rows in (1, 3, 4, 5, 64)] + [
            gl.GGUFLinear(lin.weight, lin.kernel, precision=gl.ActivationPrecision(fine=False))(x[:rows])
            for rows in (1, 64)
        ]
    first, *rest = outs.values()
    for other in rest:
        for a, b in zip(first, other, strict=True):
            assert torch.equal(a, b)


def test_one_scope_shares_one_precision(store: GGUFStore) -> None:
    """The projections built inside one activation_precision_scope read one cell, so the load's
    decision (fine or int8) switches the whole model and nothing outside it."""
    with gl.activation_precision_scope() as cell:
        a = gl.gguf_linear([raw_of(store, "Q4_K")])
        b = gl.gguf_linear([raw_of(store, "Q8_0")])
    outside = gl.gguf_linear([raw_of(store, "Q4_K")])
    assert a.precision is cell and b.precision is cell and cell.members == 2
    assert outside.precision is not cell and outside.fine
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(3))
    fine = a(x)
    cell.fine = False
    assert not a.fine and not b.fine and outside.fine
    assert not torch.equal(a(x), fine) and torch.equal(outside(x), fine)


@pytest.mark.parametrize("t", TYPES)
def test_torch_fallback_every_type(store: GGUFStore, t: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRALE_KERNELS", "native")
    r = raw_of(store, t)
    lin = gl.gguf_linear([r])
    assert lin.kernel is None and lin.weight.codes is not None
    _, codes, d, m = gb.decode(gr._blocks(r, slice(None)), t)
    codes_t = torch.from_numpy(codes.astype(np.int16))
    for rows in (1, 5, 64):
        x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows))
        _check(lin(x), x, r, codes_t, torch.from_numpy(d), None if m is None else torch.from_numpy(m))
    coarse = gl.GGUFLinear(lin.weight, None, precision=gl.ActivationPrecision(fine=False))
    _check(coarse(x), x, r, codes_t, torch.from_numpy(d), None if m is None else torch.from_numpy(m), fine=False)


@pytest.mark.parametrize("t", ["Q8_0", "Q6_K", "Q4_K"])
def test_quant_embedding_rows(store: GGUFStore, t: str) -> None:
    r = raw_of(store, t)
    table = gl.QuantEmbedding(r, torch.float32)
    ids = torch.tensor([[3, 0, 3], [47, 5, 3]])
    np.testing.assert_array_equal(table.lookup(ids).numpy(), dequantized(r)[ids.numpy()])


@pytest.mark.parametrize("t", ["Q4_K", "Q8_0"])
def test_a_lazy_projection_repacks_on_its_first_call_once_to_the_same_bits(
    store: GGUFStore, t: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lazy`` (an MoE's routed experts): nothing is repacked when built, the first call repacks
    once, and the records -- so every result -- are an eager build's."""
    calls = []
    real = gl.repack
    monkeypatch.setattr(gl, "repack", lambda raws, native: calls.append(len(raws)) or real(raws, native))
    with gl.activation_precision_scope() as cell:
        lazy = gl.gguf_linear([raw_of(store, t)], lazy=True)
    assert lazy.pending and calls == [] and lazy.out_features == N and cell.members == 1
    eager = gl.gguf_linear([raw_of(store, t)])
    assert calls == [1]
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(4))
    assert torch.equal(lazy(x), eager(x)) and not lazy.pending and calls == [1, 1]
    assert torch.equal(lazy(x[:1]), eager(x[:1])) and calls == [1, 1]  # repacked once
    assert isinstance(lazy.weight, gr.Repacked)
