"""The kernel contract of ``metrale_core.kernels``: path choice, forcing, input checks, PTX builds."""

from __future__ import annotations

import ctypes

import pytest
import torch
from loguru import logger

from metrale_core.errors import ConfigError
from metrale_core.kernels import (
    KERNELS_ENV,
    CustomOp,
    KernelCompileError,
    KernelInputError,
    check_contiguous,
    check_dtype,
    check_shape,
    check_tensor,
    compile_ptx,
    cupy_unavailable_reason,
    find_cu_files,
    load_raw_module,
    nvcc_path,
    select_path,
)
from metrale_core.kernels import cpu as cpu_mod
from metrale_core.kernels.checks import check_paged_kv
from metrale_core.kernels.cpu import build_cpu_library, compiler, cpu_library, cpu_sources, cpu_unavailable_reason
from metrale_core.kernels.cuda import CORE_INCLUDE_DIR, KERNEL_INCLUDE_DIRS, expand_includes
from metrale_core.testing.requires import missing


class AddOne(CustomOp):
    kernel_package = "metrale_core"
    kernel_file = "add_one.cu"

    def forward_native(self, x):
        return x + 1

    def forward_cuda(self, x):  # pragma: no cover - needs a GPU
        raise AssertionError("the CPU test must never take the CUDA path")


class NoKernel(CustomOp):
    def forward_native(self, x):
        return x * 2


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(KERNELS_ENV, raising=False)


def test_cpu_ops_take_the_native_path_and_dispatch_to_it():
    op = AddOne("cpu")
    assert op.path == "native"
    assert torch.equal(op(torch.zeros(3)), torch.ones(3))
    assert "path=native" in repr(op)
    with pytest.raises(ConfigError, match="no CUDA module"):
        op.kernel("add_one_f32")


def test_forcing_cuda_where_it_cannot_run_is_an_error(monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, "cuda")
    with pytest.raises(ConfigError, match=f"{KERNELS_ENV}=cuda.*AddOne.*runs on cpu"):
        AddOne("cpu")
    with pytest.raises(ConfigError, match="no CUDA kernel"):
        NoKernel(torch.device("cuda"))


def test_forcing_native_and_rejecting_bad_values(monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, "native")
    assert select_path("AddOne", torch.device("cuda")) == "native"
    monkeypatch.setenv(KERNELS_ENV, "triton")
    with pytest.raises(ConfigError, match=r"native.*cuda"):
        select_path("AddOne", torch.device("cpu"))


@pytest.mark.skipif(cupy_unavailable_reason() is None, reason="cupy is usable here")
def test_cuda_model_without_cupy_falls_back_and_logs_the_reason_once():
    lines: list[str] = []
    sink = logger.add(lines.append, level="WARNING", format="{message}")
    logger.enable("metrale_core")
    try:
        for _ in range(3):
            assert AddOne(torch.device("cuda")).path == "native"
    finally:
        logger.remove(sink)
    assert len(lines) == 1 and "AddOne" in lines[0] and "cupy" in lines[0]
    with pytest.raises(ConfigError, match="cupy"):
        load_raw_module("metrale_core.layers", "rmsnorm.cu")


def test_input_checks_name_the_op_and_argument():
    x = torch.zeros(4, 6)
    check_tensor("Op", "x", x, dtypes=(torch.float32,), shape=(-1, 6))
    with pytest.raises(KernelInputError, match=r"Op: x has dtype torch.float64"):
        check_dtype("Op", "x", x.double(), (torch.float32, torch.bfloat16))
    with pytest.raises(KernelInputError, match=r"x has shape \[4, 6\], expected \[\*, 5\]"):
        check_shape("Op", "x", x, (-1, 5))
    with pytest.raises(KernelInputError, match="must be contiguous"):
        check_contiguous("Op", "x", x.t())
    assert issubclass(KernelInputError, ValueError)


def test_paged_kv_check_names_each_argument_of_the_cache():
    k = torch.zeros(3, 16, 2, 8, dtype=torch.bfloat16)
    tables = torch.zeros(4, 5, dtype=torch.int64)
    lens = torch.zeros(4, dtype=torch.int64)
    dims = {"dtype": torch.bfloat16, "rows": 4, "heads": 2, "head_dim": 8}
    check_paged_kv("Op", k, k.clone(), tables, lens, **dims)
    bad = [
        ((k.float(), k, tables, lens), r"Op: k_cache has dtype torch.float32"),
        ((k[..., :4].contiguous(), k, tables, lens), r"k_cache has shape \[3, 16, 2, 4\], expected \[\*, \*, 2, 8\]"),
        ((k, k[:2].contiguous(), tables, lens), r"v_cache has shape \[2, 16, 2, 8\], expected \[3, 16, 2, 8\]"),
        ((k, k, tables[:3], lens), r"block_tables has shape \[3, 5\], expected \[4, \*\]"),
        ((k, k, tables, lens.int()), r"context_lens has dtype torch.int32"),
        ((k, k, tables.t().contiguous().t(), lens), r"block_tables must be contiguous"),
    ]
    for args, message in bad:
        with pytest.raises(KernelInputError, match=message):
            check_paged_kv("Op", *args, **dims)


def test_find_cu_files_by_directory_and_by_package(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "z.cu").write_text("")
    (tmp_path / "y.cu").write_text("")
    (tmp_path / "x.cuh").write_text("")
    assert [p.name for p in find_cu_files(tmp_path)] == ["z.cu", "y.cu"]
    assert all(p.is_absolute() for p in find_cu_files(tmp_path))
    assert isinstance(find_cu_files("metrale_core"), list)
    with pytest.raises(ConfigError, match="not importable"):
        find_cu_files("no_such_package_xyz")


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_compile_ptx_builds_and_reports_nvcc_errors(tmp_path):
    good = tmp_path / "ok.cu"
    good.write_text(
        'extern "C" __global__ void add_one_f32(float* x, int n) {\n'
        "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }\n"
    )
    ptx = compile_ptx(good, tmp_path / "out")
    assert ptx == tmp_path / "out" / "ok.ptx" and ".entry add_one_f32" in ptx.read_text()
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }\n')
    with pytest.raises(KernelCompileError, match="undefined_name"):
        compile_ptx(bad, tmp_path / "out")


def _two_headers_sharing_the_core_one(root):
    """A kernel including two plugin headers that both include the core's metrale_bf16.cuh."""
    (root / "a.cuh").write_text(
        '#ifndef A_CUH\n#define A_CUH\n#include "metrale_bf16.cuh"\n'
        "__device__ float twice(float x) { return 2.0f * x; }\n#endif\n"
    )
    (root / "b.cuh").write_text(
        '#ifndef B_CUH\n#define B_CUH\n#include "metrale_bf16.cuh"\n'
        "__device__ float thrice(float x) { return 3.0f * x; }\n#endif\n"
    )
    cu = root / "k.cu"
    cu.write_text(
        '#include "a.cuh"\n#include "b.cuh"\n'
        'extern "C" __global__ void k_bf16(bf16* x) {\n'
        "  x[0] = from_float<bf16>(thrice(twice(to_float(x[0])))); }\n"
    )
    return cu


def test_expand_includes_finds_core_headers_and_inlines_each_once(tmp_path):
    assert KERNEL_INCLUDE_DIRS[0] == CORE_INCLUDE_DIR
    assert (CORE_INCLUDE_DIR / "metrale_bf16.cuh").is_file()
    source = expand_includes(_two_headers_sharing_the_core_one(tmp_path))
    assert "#include" not in source
    assert source.count("struct bf16 {") == 1 and source.count("from_float<bf16>(float x)") == 1
    assert source.index("struct bf16 {") < source.index("twice") < source.index("thrice")
    # Beside the including file wins over the core's include folder.
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "metrale_bf16.cuh").write_text("// local copy\n")
    (tmp_path / "local" / "k.cu").write_text('#include "metrale_bf16.cuh"\n')
    assert expand_includes(tmp_path / "local" / "k.cu") == "// local copy\n"
    (tmp_path / "missing.cu").write_text('#include "nowhere.cuh"\n')
    with pytest.raises(ConfigError, match=r"'nowhere.cuh' not found beside it nor in .*include"):
        expand_includes(tmp_path / "missing.cu")


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")
def test_nvcc_on_the_raw_source_and_on_the_inlined_one_agree(tmp_path):
    """compile_ptx's -I finds the core header as expand_includes does; the guards keep one copy."""
    cu = _two_headers_sharing_the_core_one(tmp_path)
    raw = compile_ptx(cu, tmp_path / "raw").read_text()
    flat = tmp_path / "flat" / "k.cu"
    flat.parent.mkdir()
    flat.write_text(expand_includes(cu))
    inlined = compile_ptx(flat, tmp_path / "inlined").read_text()
    assert ".entry k_bf16" in raw and raw == inlined


# --- the C CPU path ---------------------------------------------------------------------------


class Doubler(CustomOp):
    """An op whose CPU kernel lives in the C library of ``kernel_package``."""

    kernel_package = "metrale_fake_cpu_pkg"
    cpu_kernels = True

    def forward_native(self, x):
        return x * 2

    def forward_cpu(self, x):
        out = torch.empty_like(x)
        self.cpu_kernel.twice(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()), x.numel())
        return out


@pytest.fixture
def fake_cpu_package(tmp_path, monkeypatch):
    """An importable package with one ``kernels/cpu/*.c`` file, its build cached under tmp_path."""
    pkg = tmp_path / "src" / "metrale_fake_cpu_pkg"
    (pkg / "kernels" / "cpu").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels" / "cpu" / "twice.c").write_text(
        '#include "metrale_cpu_math.h"\n'
        "void twice(const float *x, float *y, long n) { for (long i = 0; i < n; i++) y[i] = 2 * x[i]; }\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("METRALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cpu_mod.CPU_ISA_ENV, raising=False)
    _forget("metrale_fake_cpu_pkg")
    yield pkg
    _forget("metrale_fake_cpu_pkg")


def _forget(package):
    for key in [k for k in cpu_mod._libraries if k[0] == package]:
        del cpu_mod._libraries[key]


@pytest.fixture
def needs_cpu_build():
    """A CPU that runs a C variant (else skip) and a compiler (else skip, or fail under CI=true)."""
    if not cpu_mod.cpu_capable():
        pytest.skip("needs an x86-64 CPU with AVX2+FMA+F16C")
    if compiler() is None:
        missing("no C compiler on a CPU that runs the C kernels")


def test_cpu_ops_build_their_package_library_once_and_dispatch_to_it(fake_cpu_package, tmp_path, needs_cpu_build):
    op = Doubler("cpu")
    assert op.path == "cpu" and "path=cpu" in repr(op)
    assert torch.equal(op(torch.arange(5.0)), torch.arange(5.0) * 2)
    built = list((tmp_path / "cache" / "cpu-kernels").iterdir())
    assert len(built) == 1 and built[0].name.startswith("metrale_fake_cpu_pkg-")  # no temporary left
    assert Doubler("cpu").cpu_kernel is op.cpu_kernel  # loaded once per process
    assert Doubler(torch.device("meta")).path == "native"


def test_a_cpu_library_is_rebuilt_only_when_its_sources_change(fake_cpu_package, tmp_path, needs_cpu_build):
    sources = cpu_sources("metrale_fake_cpu_pkg")
    assert [s.name for s in sources] == ["twice.c"]
    first = build_cpu_library(sources, "lib", tmp_path / "out")
    mtime = first.stat().st_mtime_ns
    assert build_cpu_library(sources, "lib", tmp_path / "out") == first and first.stat().st_mtime_ns == mtime
    sources[0].write_text(sources[0].read_text() + "int extra(void) { return 1; }\n")
    assert build_cpu_library(sources, "lib", tmp_path / "out") != first


def test_cpu_library_reports_why_it_cannot_run(fake_cpu_package, monkeypatch):
    monkeypatch.setattr(cpu_mod, "cpu_flags", lambda: {"sse2"})
    assert cpu_library("metrale_fake_cpu_pkg") is None
    assert "lacks avx2, fma, f16c" in cpu_unavailable_reason("metrale_fake_cpu_pkg")
    assert not cpu_mod.cpu_capable()
    assert Doubler("cpu").path == "native"
    monkeypatch.setenv(KERNELS_ENV, "cpu")
    with pytest.raises(ConfigError, match=f"{KERNELS_ENV}=cpu.*Doubler.*lacks avx2"):
        Doubler("cpu")


def test_the_best_variant_the_cpu_runs_is_chosen_and_can_be_forced(monkeypatch):
    monkeypatch.delenv(cpu_mod.CPU_ISA_ENV, raising=False)
    monkeypatch.setattr(cpu_mod.platform, "machine", lambda: "x86_64")
    avx512 = set(cpu_mod.CPU_VARIANTS["avx512"].cpu_needs) | set(cpu_mod.CPU_VARIANTS["avx2"].cpu_needs)
    monkeypatch.setattr(cpu_mod, "cpu_flags", lambda: avx512)
    assert cpu_mod.runnable_isas() == ["avx512", "avx2"]
    assert cpu_mod.selected_isa() == ("avx512", "the CPU has AVX512-VNNI")
    monkeypatch.setenv(cpu_mod.CPU_ISA_ENV, "avx2")
    assert cpu_mod.selected_isa() == ("avx2", f"{cpu_mod.CPU_ISA_ENV}=avx2")
    monkeypatch.setattr(cpu_mod, "cpu_flags", lambda: {"avx2", "fma", "f16c", "sse2"})
    monkeypatch.delenv(cpu_mod.CPU_ISA_ENV)
    isa, why = cpu_mod.selected_isa()
    assert isa == "avx2" and "not AVX512-VNNI" in why
    monkeypatch.setenv(cpu_mod.CPU_ISA_ENV, "avx512")
    assert cpu_mod.selected_isa() == (
        None,
        f"{cpu_mod.CPU_ISA_ENV}=avx512 but the CPU lacks avx512f, avx512bw, avx512vl, avx512dq, avx512_vnni",
    )
    monkeypatch.setenv(cpu_mod.CPU_ISA_ENV, "neon")
    assert "is not one of avx512, avx2" in cpu_mod.selected_isa()[1]
    monkeypatch.setattr(cpu_mod.platform, "machine", lambda: "aarch64")
    monkeypatch.delenv(cpu_mod.CPU_ISA_ENV)
    assert cpu_mod.selected_isa() == (None, "the CPU is aarch64, not x86-64") and not cpu_mod.cpu_capable()


def test_a_failed_build_is_a_warning_naming_the_compiler_error(fake_cpu_package, monkeypatch, needs_cpu_build):
    (fake_cpu_package / "kernels" / "cpu" / "broken.c").write_text("int broken( {\n")
    lines: list[str] = []
    sink = logger.add(lines.append, level="WARNING", format="{level} {message}")
    logger.enable("metrale_core")
    try:
        assert cpu_library("metrale_fake_cpu_pkg") is None
    finally:
        logger.remove(sink)
    reason = cpu_unavailable_reason("metrale_fake_cpu_pkg")
    assert "could not be built" in reason and "broken.c" in reason
    assert len(lines) == 1 and lines[0].startswith("WARNING") and "metrale_fake_cpu_pkg" in lines[0]
    assert "broken.c" in lines[0] and "fall back to torch" in lines[0]
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(RuntimeError, match="no C compiler"):
        build_cpu_library(cpu_sources("metrale_fake_cpu_pkg"), "x")


def test_forcing_native_never_builds_the_c_library(fake_cpu_package, tmp_path, monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, "native")
    assert Doubler("cpu").path == "native"
    assert not [k for k in cpu_mod._libraries if k[0] == "metrale_fake_cpu_pkg"]
    assert not (tmp_path / "cache" / "cpu-kernels").exists()


def test_forcing_cpu_on_an_op_without_c_kernels_is_an_error(monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, "cpu")
    with pytest.raises(ConfigError, match="no CPU kernel"):
        NoKernel("cpu")
