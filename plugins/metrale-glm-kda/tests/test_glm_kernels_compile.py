"""The plugin's CUDA kernels compile with ``nvcc --ptx`` (as NVRTC sees them too) and export
their f32 / bf16 entry points."""

from __future__ import annotations

import pytest

from metrale_core.kernels import compile_runtime_source, find_cu_files
from metrale_core.testing.kernel_build import assert_inlined_once, needs_nvcc

KERNELS = {
    "kda_decode.cu": ("kda_decode_f32", "kda_decode_bf16"),
    "short_conv.cu": ("short_conv_update_f32", "short_conv_update_bf16"),
    "moe_routing.cu": ("moe_routing_f32",),
    "hc_sinkhorn.cu": ("hc_sinkhorn_f32",),
}


def test_plugin_ships_its_kernels():
    assert {p.name for p in find_cu_files("metrale_glm_kda")} == set(KERNELS)


@needs_nvcc
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_compiles_with_inlined_headers(name, tmp_path):
    assert_inlined_once(compile_runtime_source("metrale_glm_kda", name, tmp_path), KERNELS[name])
