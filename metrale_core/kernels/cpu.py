"""C kernels for the CPU path: build a package's ``kernels/cpu/*.c`` into one library, load it.

Owner: ``metrale_core.kernels``.  ``CustomOp`` subclasses with ``cpu_kernels = True`` run their
``forward_cpu`` on the library of their ``kernel_package``; other code (a weight format's matmul)
calls :func:`cpu_library` directly.

The sources are compiled with the system C compiler (``$CC``, else ``cc`` / ``gcc``) and
``CPU_CFLAGS`` into ``$METRALE_CACHE_DIR/cpu-kernels/<package>-<hash>.so``, once per hash of the
sources, the shared headers in ``include/`` and the flags.  The library is loaded with ctypes after
torch, so its OpenMP runtime is the ``libgomp.so.1`` torch already loaded: torch's ops and the C
kernels share one thread team per calling thread.

Invariants:
- :func:`cpu_library` never raises: it returns None when the CPU lacks an ISA extension in
  ``CPU_ISA``, the machine is not x86-64, there is no compiler or the build fails, and
  :func:`cpu_unavailable_reason` then says why.  Callers keep their torch path.
- A library is built and loaded at most once per process and package (thread-safe); the build
  writes to a temporary file and renames it, so concurrent builders never load a partial file.
- Entry points take raw pointers (``tensor.data_ptr()``), return 0 on success and -1 for
  arguments they cannot take; they release no Python objects, so ctypes runs them without the GIL.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from loguru import logger

from metrale_core.embedded import cache_dir

__all__ = ["CPU_CFLAGS", "CPU_ISA", "INCLUDE_DIR", "build_cpu_library", "compiler", "cpu_flags",
           "cpu_library", "cpu_sources", "cpu_unavailable_reason"]

INCLUDE_DIR = Path(__file__).parent / "include"
#: Every C CPU library is compiled for this ISA (Intel since Ice Lake / Sapphire Rapids, AMD Zen 4).
CPU_CFLAGS = ("-O3", "-std=c11", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
              "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma")
#: ``/proc/cpuinfo`` flags the machine needs to run those libraries.
CPU_ISA = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c", "fma")

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL | None] = {}
_reasons: dict[str, str] = {}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The ``flags`` of ``/proc/cpuinfo`` (empty where there is none); read once per process."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else ``cc`` or ``gcc`` on PATH (None if none)."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


def cpu_sources(package: str) -> list[Path]:
    """The ``kernels/cpu/*.c`` files of import package ``package`` (sorted; empty if none)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations))) / "kernels" / "cpu"
    return sorted(root.glob("*.c"))


def build_cpu_library(sources: list[Path], name: str, out_dir: Path | None = None) -> Path:
    """Compile ``sources`` into one shared library (unless the same build is cached) and return
    its path; raises ``RuntimeError`` with the compiler's message when it cannot."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (install gcc or set $CC)")
    if not sources:
        raise RuntimeError(f"{name} has no C sources")
    digest = hashlib.sha256(" ".join((cc, *CPU_CFLAGS)).encode())
    for path in [*sources, *sorted(INCLUDE_DIR.glob("*.h"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    out_dir = Path(out_dir) if out_dir is not None else cache_dir() / "cpu-kernels"
    lib = out_dir / f"{name}-{digest.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    logger.info("building the C CPU kernels of {} (once per version, a few seconds)", name)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_lib = Path(tmp) / lib.name
        command = [cc, *CPU_CFLAGS, f"-I{INCLUDE_DIR}", *map(str, sources), "-o", str(tmp_lib), "-lm"]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(cc).name} failed on {', '.join(s.name for s in sources)}:\n"
                               f"{proc.stderr.strip()[-3000:]}")
        os.replace(tmp_lib, lib)
    return lib


def _load(package: str) -> ctypes.CDLL | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        _reasons[package] = f"the CPU is {platform.machine()}, not x86-64"
        return None
    missing = [f for f in CPU_ISA if f not in cpu_flags()]
    if missing:
        _reasons[package] = f"the CPU lacks {', '.join(missing)}"
        return None
    import torch  # noqa: F401  -- load torch's libgomp first, so the library shares it

    try:
        return ctypes.CDLL(str(build_cpu_library(cpu_sources(package), package)))
    except (RuntimeError, OSError) as exc:
        _reasons[package] = f"its C kernels could not be built: {exc}"
        return None


def cpu_library(package: str) -> ctypes.CDLL | None:
    """The loaded C library of ``package`` (built on first use), or None where it cannot run."""
    with _lock:
        if package not in _libraries:
            _libraries[package] = _load(package)
        return _libraries[package]


def cpu_unavailable_reason(package: str) -> str | None:
    """Why :func:`cpu_library` is None for ``package`` (None when it is available)."""
    if cpu_library(package) is not None:
        return None
    return _reasons.get(package, "unknown")
