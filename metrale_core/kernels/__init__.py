"""The kernel contract shared by every plugin: ``CustomOp`` plus CuPy loading, PTX checks and the
C CPU libraries.

Owner: ``metrale_core.kernels``.  Plugins subclass :class:`CustomOp` (a torch ``forward_native``
oracle, a CuPy ``forward_cuda`` and optionally a C ``forward_cpu``), ship ``.cu`` and
``kernels/cpu/*.c`` sources as package data, and test them with :func:`find_cu_files` /
:func:`compile_ptx` and :func:`cpu_library`.

Invariants: importing this package never imports CuPy nor builds C code;
``METRALE_KERNELS=native|cuda|cpu`` forces a path for every op and forcing one where it cannot run
is a ``ConfigError``.
"""

from __future__ import annotations

from metrale_core.kernels.checks import (
    KernelInputError,
    check_contiguous,
    check_dtype,
    check_same_device,
    check_shape,
    check_tensor,
)
from metrale_core.kernels.cpu import cpu_library, cpu_unavailable_reason
from metrale_core.kernels.cuda import cupy_unavailable_reason, load_raw_module
from metrale_core.kernels.custom_op import (
    KERNELS_ENV,
    CustomOp,
    KernelPath,
    requested_path,
    select_path,
)
from metrale_core.kernels.ptx import (
    KernelCompileError,
    compile_ptx,
    compile_runtime_source,
    find_cu_files,
    nvcc_path,
    ptx_entries,
)

__all__ = [
    "KERNELS_ENV",
    "CustomOp",
    "KernelCompileError",
    "KernelInputError",
    "KernelPath",
    "check_contiguous",
    "check_dtype",
    "check_same_device",
    "check_shape",
    "check_tensor",
    "compile_ptx",
    "compile_runtime_source",
    "cpu_library",
    "cpu_unavailable_reason",
    "cupy_unavailable_reason",
    "find_cu_files",
    "load_raw_module",
    "nvcc_path",
    "ptx_entries",
    "requested_path",
    "select_path",
]
