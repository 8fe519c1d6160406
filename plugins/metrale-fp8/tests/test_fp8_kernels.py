"""The FP8 kernels: nvcc --ptx compile checks (CPU) and kernel-vs-oracle checks (CUDA only)."""

from __future__ import annotations

import pytest
import torch

from metrale_core.kernels import compile_runtime_source, find_cu_files
from metrale_core.testing.kernel_build import assert_inlined_once, needs_nvcc

KERNELS = {"fp8_kv_write.cu": "fp8_kv_write", "fp8_paged_attention_decode.cu": "fp8_paged_attention_decode"}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_plugin_ships_its_kernels():
    assert set(KERNELS) <= {p.name for p in find_cu_files("metrale_fp8")}


@needs_nvcc
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_compiles_with_inlined_headers(name, tmp_path):
    """What NVRTC gets at run time (quoted includes inlined) builds warning-free for sm_90."""
    build = compile_runtime_source("metrale_fp8", name, tmp_path)
    assert_inlined_once(build, [f"{KERNELS[name]}_f32", f"{KERNELS[name]}_bf16"])


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kernel_matches_torch_quantize(dtype):
    from metrale_fp8.ops import Fp8KVCacheWrite

    op = Fp8KVCacheWrite("cuda")
    gen = torch.Generator().manual_seed(0)
    k = (torch.randn((37, 2, 64), generator=gen) * 50).to("cuda", dtype)
    k[0, 0, :4] = torch.tensor([1e9, -1e9, float("inf"), 3e-5])
    v = (torch.randn((37, 2, 64), generator=gen)).to("cuda", dtype)
    slots = torch.randperm(64, generator=gen)[:37].cuda()
    scales = (torch.tensor([0.05, 0.2], device="cuda"), torch.tensor([0.01, 0.02], device="cuda"))
    caches = [torch.zeros((8, 8, 2, 64), dtype=torch.float8_e4m3fn, device="cuda") for _ in range(4)]
    op(k, v, caches[0], caches[1], slots, *scales)
    op.forward_native(k, v, caches[2], caches[3], slots, *scales)
    assert torch.equal(caches[0].view(torch.uint8), caches[2].view(torch.uint8))
    assert torch.equal(caches[1].view(torch.uint8), caches[3].view(torch.uint8))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_matches_oracle(dtype):
    from metrale_fp8.ops import Fp8PagedAttentionDecode

    op = Fp8PagedAttentionDecode("cuda")
    gen = torch.Generator().manual_seed(1)
    codes = lambda: (torch.randn((16, 4, 2, 64), generator=gen) * 100).clamp(-448, 448).to(torch.float8_e4m3fn).cuda()
    k_cache, v_cache = codes(), codes()
    q = torch.randn((3, 8, 64), generator=gen).to("cuda", dtype)
    tables = torch.randperm(16, generator=gen)[:12].view(3, 4).cuda()
    context = torch.tensor([5, 16, 9], device="cuda")
    args = (
        q,
        k_cache,
        v_cache,
        torch.tensor([0.01, 0.02], device="cuda"),
        torch.tensor([0.03, 0.01], device="cuda"),
        tables,
        context,
        64**-0.5,
        16,
    )
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(op(*args), op.forward_native(*args), **tol)
