"""The top-2 scan: ``kernels/top2.cu`` compiles with ``nvcc --ptx`` and exports its entry point;
the op's torch path is ``torch.topk``; on a GPU (``gpu`` marker) the kernel matches it."""

from __future__ import annotations

import pytest
import torch

from metrale_b1.top2 import Top2
from metrale_core.kernels import (
    compile_ptx,
    cupy_unavailable_reason,
    find_cu_files,
    nvcc_path,
    ptx_entries,
)

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
_NO_GPU = "no CUDA device" if not torch.cuda.is_available() else cupy_unavailable_reason()
needs_gpu = pytest.mark.skipif(_NO_GPU is not None, reason=str(_NO_GPU))


def test_plugin_ships_its_kernel():
    assert [p.name for p in find_cu_files("metrale_b1")] == ["top2.cu"]


@needs_nvcc
def test_top2_kernel_compiles(tmp_path):
    from metrale_core.kernels.cuda import kernel_path

    ptx = compile_ptx(
        kernel_path("metrale_b1", "top2.cu"), tmp_path, arch="sm_90", options=("-Werror", "all-warnings")
    ).read_text()
    assert ".target sm_90" in ptx
    assert ptx_entries(ptx) == ["top2_rows_f32"]


def test_native_path_is_topk_and_leaves_the_input_alone():
    op = Top2("cpu")
    assert op.path == "native"
    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(3))
    copy = logits.clone()
    values, ids = op(logits)
    ref_values, ref_ids = torch.topk(copy, 2, dim=-1)
    assert torch.equal(values, ref_values) and torch.equal(ids, ref_ids)
    assert values.shape == ids.shape == (5, 2) and ids.dtype == torch.int64
    assert torch.equal(logits, copy)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("rows, vocab", [(1, 2), (3, 33), (16, 49152), (7, 151936)])
def test_kernel_matches_topk_on_the_gpu(rows, vocab):
    op = Top2("cuda")
    assert op.path == "cuda"
    logits = torch.randn(rows, vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(rows))
    logits[0, vocab - 1] = float("-inf")
    copy = logits.clone()
    values, ids = op(logits)
    ref_values, ref_ids = torch.topk(logits, 2, dim=-1)
    torch.testing.assert_close(values, ref_values, rtol=0, atol=0)
    assert torch.equal(ids, ref_ids) and torch.equal(logits, copy)


@pytest.mark.gpu
@needs_gpu
def test_kernel_edge_rows_on_the_gpu():
    op = Top2("cuda")
    logits = torch.full((4, 3000), float("-inf"), device="cuda")
    logits[0, 7] = logits[0, 2000] = 5.0  # tie: the lower index first
    logits[1, 10] = 1.0  # one finite logit, then -inf
    logits[2, :] = float("nan")
    logits[2, 5], logits[2, 6] = 2.0, 3.0  # NaN never ranks
    values, ids = op(logits)
    assert ids[0].tolist() == [7, 2000] and values[0].tolist() == [5.0, 5.0]
    assert ids[1, 0].item() == 10 and values[1, 1].item() == float("-inf")
    assert ids[2].tolist() == [6, 5]
    assert values[3].tolist() == [float("-inf")] * 2
