"""The plugin's CUDA kernels compile with ``nvcc --ptx`` (as NVRTC sees them too) and export
their f32 / bf16 entry points."""

from __future__ import annotations

import re

import pytest

from metrale_core.kernels import compile_ptx, find_cu_files, nvcc_path

KERNELS = {"kda_decode.cu": ("kda_decode_f32", "kda_decode_bf16"),
           "short_conv.cu": ("short_conv_update_f32", "short_conv_update_bf16"),
           "moe_routing.cu": ("moe_routing_f32",),
           "hc_sinkhorn.cu": ("hc_sinkhorn_f32",)}

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")


def test_plugin_ships_its_kernels():
    assert {p.name for p in find_cu_files("metrale_glm_kda")} == set(KERNELS)


@needs_nvcc
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_compiles_with_inlined_headers(name, tmp_path):
    from metrale_core.kernels.cuda import expand_includes, kernel_path

    source = expand_includes(kernel_path("metrale_glm_kda", name))
    assert "#include" not in source
    flat = tmp_path / name
    flat.write_text(source)
    text = compile_ptx(flat, tmp_path / "ptx", arch="sm_90", options=("-Werror", "all-warnings")).read_text()
    assert ".target sm_90" in text
    assert set(KERNELS[name]) <= set(re.findall(r"\.entry\s+(\w+)", text))
