"""Every ``.cu`` file of the project compiles with ``nvcc --ptx`` and exports its entry points."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_core.kernels import compile_ptx, compile_runtime_source, find_cu_files, ptx_entries
from metrale_core.testing.kernel_build import assert_inlined_once, needs_nvcc

REPO = Path(__file__).resolve().parents[3]
CU_FILES = [p for root in (REPO / "plugins", REPO / "metrale_core") if root.is_dir() for p in find_cu_files(root)]
OWN_KERNELS = {
    "rmsnorm.cu": "rmsnorm",
    "qk_norm_rope.cu": "qk_norm_rope",
    "swiglu.cu": "swiglu",
    "kv_cache_write.cu": "kv_cache_write",
    "paged_attention_decode.cu": "paged_attention_decode",
}


def test_core_layers_ship_all_decoder_kernels():
    import metrale_core.layers

    found = {p.name for p in find_cu_files("metrale_core.layers")}
    assert set(OWN_KERNELS) <= found
    assert all(p in CU_FILES for p in find_cu_files("metrale_core.layers"))
    assert (Path(metrale_core.layers.__file__).parent / "kernels" / "common.cuh").is_file()


@needs_nvcc
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_cu_file_compiles_to_ptx(cu, tmp_path):
    ptx = compile_ptx(cu, tmp_path, arch="sm_90")
    text = ptx.read_text()
    assert ".target sm_90" in text
    if cu.name in OWN_KERNELS:
        entries = set(ptx_entries(text))
        stem = OWN_KERNELS[cu.name]
        assert {f"{stem}_f32", f"{stem}_bf16"} <= entries


@needs_nvcc
@pytest.mark.parametrize("name", sorted(OWN_KERNELS))
def test_runtime_source_with_inlined_headers_compiles(name, tmp_path):
    """What NVRTC gets at run time (``load_raw_module`` inlines quoted includes) builds too."""
    build = compile_runtime_source("metrale_core.layers", name, tmp_path)
    assert_inlined_once(build, [f"{OWN_KERNELS[name]}_bf16"])
