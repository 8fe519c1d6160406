"""CuPy access for kernels: lazy import, cached ``RawModule`` loading, launch argument helpers.

Owner: ``metrale_core.kernels``.  Kernel sources are ``.cu`` files shipped as package data of the
package that owns the op (``load_raw_module("metrale_qwen3", "rmsnorm.cu")``).  Device headers
shared by every plugin (``metrale_bf16.cuh``, ``metrale_reduce.cuh``) live in
:data:`CORE_INCLUDE_DIR`.

Invariants:
- CuPy is imported only when a CUDA path is actually built; importing this module never needs it.
- A given (package, file, options) triple is compiled once per process (``functools.cache``).
- A quoted include (``#include "x.cuh"``) resolves beside the including file first, then in each
  of :data:`KERNEL_INCLUDE_DIRS` in order -- the order nvcc uses for ``compile_ptx``'s ``-I``, so
  NVRTC and the PTX tests compile the same headers.  Each header is inlined once per source.
- Kernels receive raw device pointers (``ptr(t)``) and explicit 32-bit / float32 scalars, and run
  on torch's current CUDA stream so they order correctly with torch ops.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from metrale_core.errors import ConfigError

__all__ = [
    "CORE_INCLUDE_DIR",
    "KERNEL_INCLUDE_DIRS",
    "cupy_unavailable_reason",
    "expand_includes",
    "f32",
    "i32",
    "i64",
    "kernel_path",
    "load_raw_module",
    "ptr",
    "torch_stream",
]

#: The core's shared device headers (package data of ``metrale_core``).
CORE_INCLUDE_DIR = Path(__file__).resolve().parent / "include"
#: Where a quoted include not found beside its includer is looked up, in order.
KERNEL_INCLUDE_DIRS: tuple[Path, ...] = (CORE_INCLUDE_DIR,)


@functools.cache
def cupy_unavailable_reason() -> str | None:
    """``None`` when CuPy imports and sees a device, else a sentence saying why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA runtime load failure inside cupy
        return f"cupy is not importable ({type(exc).__name__}: {exc}); install metrale-core[cuda]"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "cupy sees no CUDA device"
    except Exception as exc:
        return f"cupy cannot query CUDA devices ({exc})"
    return None


def kernel_path(package: str, filename: str) -> Path:
    """The file ``filename`` under ``<package>/kernels/`` (or the package root)."""
    root = importlib.resources.files(package)
    for candidate in (root / "kernels" / filename, root / filename):
        if candidate.is_file():
            return Path(str(candidate))
    raise ConfigError(
        f"kernel source {filename!r} not found in package {package!r} "
        "(is it listed in the distribution's package data?)"
    )


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def _find_include(path: Path, name: str, include_dirs: Sequence[Path]) -> Path:
    for folder in (path.parent, *include_dirs):
        candidate = folder / name
        if candidate.is_file():
            return candidate.resolve()
    places = ", ".join(str(d) for d in include_dirs)
    raise ConfigError(f"{path}: included file {name!r} not found beside it" + (f" nor in {places}" if places else ""))


def expand_includes(
    path: Path, include_dirs: Sequence[Path] = KERNEL_INCLUDE_DIRS, _seen: set[Path] | None = None
) -> str:
    """``path``'s text with its quoted includes inlined (each header once, like ``#pragma once``).

    A header is looked up beside the file that includes it, then in ``include_dirs`` in order.
    """
    seen = set() if _seen is None else _seen
    seen.add(path.resolve())

    def inline(match: re.Match) -> str:
        header = _find_include(path, match.group(1), include_dirs)
        if header in seen:
            return ""
        return expand_includes(header, include_dirs, seen)

    return _INCLUDE.sub(inline, path.read_text(encoding="utf-8"))


def load_raw_module(package: str, filename: str, options: Sequence[str] = ()) -> Any:
    """Compile ``<package>/kernels/<filename>`` with NVRTC into a ``cupy.RawModule`` (cached).

    Quoted includes (``#include "common.cuh"``) are resolved beside the source, then in
    :data:`KERNEL_INCLUDE_DIRS`, and inlined, so CuPy's on-disk kernel cache, keyed by the source
    text, sees every header change.
    """
    return _load_raw_module(package, filename, tuple(options))


@functools.cache
def _load_raw_module(package: str, filename: str, options: tuple[str, ...]) -> Any:
    reason = cupy_unavailable_reason()
    if reason is not None:
        raise ConfigError(f"cannot load kernel {package}:{filename}: {reason}")
    import cupy

    source = expand_includes(kernel_path(package, filename))
    module = cupy.RawModule(code=source, options=("--std=c++17", *options))
    module.compile()
    return module


def ptr(t: torch.Tensor) -> Any:
    """A tensor's device pointer as a 64-bit kernel argument."""
    import numpy

    return numpy.uint64(t.data_ptr())


def i32(value: int) -> Any:
    import numpy

    return numpy.int32(value)


def i64(value: int) -> Any:
    import numpy

    return numpy.int64(value)


def f32(value: float) -> Any:
    import numpy

    return numpy.float32(value)


@contextmanager
def torch_stream(device: torch.device) -> Iterator[None]:
    """Make CuPy launch on torch's current stream of ``device``."""
    import cupy

    with cupy.cuda.Device(device.index or 0):
        pointer = torch.cuda.current_stream(device).cuda_stream
        wrap = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy >= 14 (ExternalStream deprecated)
        stream = wrap(_StreamHandle(pointer)) if wrap is not None else cupy.cuda.ExternalStream(pointer)
        with stream:
            yield


class _StreamHandle:
    """A raw ``cudaStream_t`` under the CUDA stream protocol (``__cuda_stream__``: version 0 and
    the handle), which CuPy 14's ``Stream.from_external`` takes."""

    __slots__ = ("pointer",)

    def __init__(self, pointer: int) -> None:
        self.pointer = pointer

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.pointer
