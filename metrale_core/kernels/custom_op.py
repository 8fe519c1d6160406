"""The kernel contract: one op, a torch reference path, a CuPy path and a C CPU path, chosen once.

Owner: ``metrale_core.kernels``.  Plugins subclass :class:`CustomOp` for every hot op; the model
builds each op once (at load time) and calls it like a function.

Invariants:
- ``forward_native`` is torch only, runs on any device, and is the oracle for the kernel.
- ``forward_cuda`` launches a ``cupy.RawModule`` compiled from the op's ``.cu`` file; it checks its
  inputs (dtype, contiguity, shape) before launch and routes shapes its kernel does not support to
  ``forward_native`` itself.
- ``forward_cpu`` (ops with ``cpu_kernels = True``) calls the C library of the op's package
  (``<kernel_package>/kernels/cpu/*.c``, see :mod:`metrale_core.kernels.cpu`) and, like
  ``forward_cuda``, routes what its kernel does not support to ``forward_native``.
- The path is chosen once, at construction: CUDA iff the op's device is a CUDA device and CuPy is
  usable; CPU iff the device is the CPU, the op has C kernels and their library runs here;
  else native -- unless ``METRALE_KERNELS`` forces a path.  The reason for running native on a
  CUDA device is logged once per (op, reason).  Forcing ``cuda`` or ``cpu`` where it cannot run
  raises ``ConfigError``; it never falls back silently.
- Choosing the CUDA or CPU path compiles the kernel immediately, so kernels are compiled (and any
  compile error surfaces) when the engine builds the model, not on the first request.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

import torch
from loguru import logger

from metrale_core.errors import ConfigError
from metrale_core.kernels.cpu import cpu_library, cpu_unavailable_reason
from metrale_core.kernels.cuda import cupy_unavailable_reason, load_raw_module

__all__ = ["KERNELS_ENV", "CustomOp", "KernelPath", "cpu_layer_library", "requested_path", "select_path"]

#: Environment variable forcing a path for every op: ``native``, ``cuda`` or ``cpu`` (unset/``auto``:
#: choose).
KERNELS_ENV = "METRALE_KERNELS"

KernelPath = Literal["native", "cuda", "cpu"]

_logged_reasons: set[tuple[str, str]] = set()


def requested_path() -> KernelPath | None:
    """The path forced by ``METRALE_KERNELS``, or ``None`` to choose automatically."""
    raw = os.environ.get(KERNELS_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in ("native", "cuda", "cpu"):
        return raw  # type: ignore[return-value]
    raise ConfigError(f"{KERNELS_ENV}={raw!r} is not valid; use 'native', 'cuda', 'cpu' or 'auto'")


def _log_once(op: str, reason: str, *, level: str) -> None:
    if (op, reason) in _logged_reasons:
        return
    _logged_reasons.add((op, reason))
    logger.log(level, "kernel {} runs the torch reference path: {}", op, reason)


def select_path(op: str, device: torch.device, has_kernel: bool = True, cpu_package: str | None = None) -> KernelPath:
    """Pick the path for op ``op`` on ``device`` (see the module invariants); ``cpu_package`` is the
    package whose C library holds the op's CPU kernel (None: the op has none)."""
    forced = requested_path()
    cuda_reason: str | None
    if not has_kernel:
        cuda_reason = "the op has no CUDA kernel"
    elif device.type != "cuda":
        cuda_reason = f"the model runs on {device.type}"
    else:
        cuda_reason = cupy_unavailable_reason()
    # Whether the C library runs is only asked where the answer decides the path: asking builds it.
    cpu_kernel_here = cpu_package is not None and device.type == "cpu"

    def cpu_reason() -> str | None:
        if cpu_package is None:
            return "the op has no CPU kernel"
        if device.type != "cpu":
            return f"the model runs on {device.type}"
        return cpu_unavailable_reason(cpu_package)

    if forced == "cuda":
        if cuda_reason is not None:
            raise ConfigError(f"{KERNELS_ENV}=cuda but kernel {op} cannot run on CUDA: {cuda_reason}")
        return "cuda"
    if forced == "cpu":
        reason = cpu_reason()
        if reason is not None:
            raise ConfigError(f"{KERNELS_ENV}=cpu but kernel {op} has no CPU kernel that runs here: {reason}")
        return "cpu"
    if forced == "native":
        if cuda_reason is None or cpu_kernel_here:
            _log_once(op, f"{KERNELS_ENV}=native", level="INFO")
        return "native"
    if cuda_reason is None:
        return "cuda"
    reason = cpu_reason()
    if reason is None:
        return "cpu"
    # Native on a CPU model is the normal case; native on a GPU model is worth a warning.
    if device.type == "cuda":
        _log_once(op, cuda_reason, level="WARNING")
    else:
        _log_once(op, reason if cpu_package is not None else cuda_reason, level="DEBUG")
    return "native"


def cpu_layer_library(op: str, package: str) -> Any:
    """``package``'s C library (``ctypes.CDLL``) when :func:`select_path` picks the CPU path for
    ``op``, a layer with a C kernel and no CUDA one; None: the layer runs its torch path."""
    if select_path(op, torch.device("cpu"), has_kernel=False, cpu_package=package) != "cpu":
        return None
    return cpu_library(package)


class CustomOp:
    """Base class of every hot op (see the module docstring for the contract).

    Subclasses set ``kernel_package`` / ``kernel_file`` (the ``.cu`` file under
    ``<kernel_package>/kernels/``) and implement ``forward_native`` and ``forward_cuda`` with the
    same signature; with ``cpu_kernels = True`` also ``forward_cpu``, which calls entry points of
    ``self.cpu_kernel`` (the package's C library).  Call the op instance; it dispatches to the path
    chosen at construction.
    """

    #: Import package that ships the kernel source, e.g. ``"metrale_qwen3"``.
    kernel_package: ClassVar[str | None] = None
    #: File name of the kernel source under ``<kernel_package>/kernels/``.
    kernel_file: ClassVar[str | None] = None
    #: Extra NVRTC options.
    kernel_options: ClassVar[tuple[str, ...]] = ()
    #: The op has a ``forward_cpu`` over the C library of ``kernel_package``.
    cpu_kernels: ClassVar[bool] = False

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        has_kernel = self.kernel_package is not None and self.kernel_file is not None
        cpu_package = self.kernel_package if self.cpu_kernels else None
        self.path: KernelPath = select_path(self.name, self.device, has_kernel, cpu_package)
        self._module: Any = None
        self._functions: dict[str, Any] = {}
        #: The package's loaded C library on the CPU path (None on the others).
        self.cpu_kernel: Any = None
        if self.path == "cuda":
            assert self.kernel_package is not None and self.kernel_file is not None  # select_path: has_kernel
            self._module = load_raw_module(self.kernel_package, self.kernel_file, tuple(self.kernel_options))
            self._impl = self.forward_cuda
        elif self.path == "cpu":
            assert cpu_package is not None  # select_path picks "cpu" only for an op with a C package
            self.cpu_kernel = cpu_library(cpu_package)
            self._impl = self.forward_cpu
        else:
            self._impl = self.forward_native

    @property
    def name(self) -> str:
        return type(self).__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._impl(*args, **kwargs)

    def __repr__(self) -> str:
        return f"{self.name}(device={self.device}, path={self.path})"

    def kernel(self, function: str) -> Any:
        """The compiled ``cupy.RawKernel`` named ``function`` (an ``extern "C"`` entry point)."""
        if self._module is None:
            raise ConfigError(f"{self.name}: no CUDA module loaded (path is {self.path})")
        fn = self._functions.get(function)
        if fn is None:
            fn = self._functions[function] = self._module.get_function(function)
        return fn

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.name} does not implement forward_native")

    def forward_cuda(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.name} does not implement forward_cuda")

    def forward_cpu(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.name} does not implement forward_cpu")
