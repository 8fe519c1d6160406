"""The kernel contract: one op, a torch reference path and a CuPy path, chosen once.

Owner: ``metrale_core.kernels``.  Plugins subclass :class:`CustomOp` for every hot op; the model
builds each op once (at load time) and calls it like a function.

Invariants:
- ``forward_native`` is torch only, runs on any device, and is the oracle for the kernel.
- ``forward_cuda`` launches a ``cupy.RawModule`` compiled from the op's ``.cu`` file; it checks its
  inputs (dtype, contiguity, shape) before launch and routes shapes its kernel does not support to
  ``forward_native`` itself.
- The path is chosen once, at construction: CUDA iff the op's device is a CUDA device and CuPy is
  usable, unless ``METRALE_KERNELS`` forces a path.  The reason for running native on a CUDA device
  is logged once per (op, reason).  Forcing ``cuda`` where it cannot run raises ``ConfigError``;
  it never falls back silently.
- Choosing the CUDA path compiles the kernel immediately, so kernels are compiled (and any
  compile error surfaces) when the engine builds the model, not on the first request.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

import torch
from loguru import logger

from metrale_core.errors import ConfigError
from metrale_core.kernels.cuda import cupy_unavailable_reason, load_raw_module

__all__ = ["KERNELS_ENV", "CustomOp", "KernelPath", "requested_path", "select_path"]

#: Environment variable forcing a path for every op: ``native`` or ``cuda`` (unset/``auto``: choose).
KERNELS_ENV = "METRALE_KERNELS"

KernelPath = Literal["native", "cuda"]

_logged_reasons: set[tuple[str, str]] = set()


def requested_path() -> KernelPath | None:
    """The path forced by ``METRALE_KERNELS``, or ``None`` to choose automatically."""
    raw = os.environ.get(KERNELS_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if raw in ("native", "cuda"):
        return raw  # type: ignore[return-value]
    raise ConfigError(f"{KERNELS_ENV}={raw!r} is not valid; use 'native', 'cuda' or 'auto'")


def _log_once(op: str, reason: str, *, level: str) -> None:
    if (op, reason) in _logged_reasons:
        return
    _logged_reasons.add((op, reason))
    logger.log(level, "kernel {} runs the torch reference path: {}", op, reason)


def select_path(op: str, device: torch.device, has_kernel: bool = True) -> KernelPath:
    """Pick the path for op ``op`` on ``device`` (see the module invariants)."""
    forced = requested_path()
    cuda_reason: str | None
    if not has_kernel:
        cuda_reason = "the op has no CUDA kernel"
    elif device.type != "cuda":
        cuda_reason = f"the model runs on {device.type}"
    else:
        cuda_reason = cupy_unavailable_reason()

    if forced == "cuda":
        if cuda_reason is not None:
            raise ConfigError(f"{KERNELS_ENV}=cuda but kernel {op} cannot run on CUDA: {cuda_reason}")
        return "cuda"
    if forced == "native":
        if cuda_reason is None:
            _log_once(op, f"{KERNELS_ENV}=native", level="INFO")
        return "native"
    if cuda_reason is None:
        return "cuda"
    # Native on a CPU model is the normal case; native on a GPU model is worth a warning.
    _log_once(op, cuda_reason, level="WARNING" if device.type == "cuda" else "DEBUG")
    return "native"


class CustomOp:
    """Base class of every hot op (see the module docstring for the contract).

    Subclasses set ``kernel_package`` / ``kernel_file`` (the ``.cu`` file under
    ``<kernel_package>/kernels/``) and implement ``forward_native`` and ``forward_cuda`` with the
    same signature.  Call the op instance; it dispatches to the path chosen at construction.
    """

    #: Import package that ships the kernel source, e.g. ``"metrale_qwen3"``.
    kernel_package: ClassVar[str | None] = None
    #: File name of the kernel source under ``<kernel_package>/kernels/``.
    kernel_file: ClassVar[str | None] = None
    #: Extra NVRTC options.
    kernel_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        has_kernel = self.kernel_package is not None and self.kernel_file is not None
        self.path: KernelPath = select_path(self.name, self.device, has_kernel)
        self._module: Any = None
        self._functions: dict[str, Any] = {}
        if self.path == "cuda":
            self._module = load_raw_module(self.kernel_package, self.kernel_file,
                                           tuple(self.kernel_options))
            self._impl = self.forward_cuda
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
