"""Offline compilation of kernel sources with ``nvcc --ptx`` (CI keeps ``.cu`` files from rotting).

Owner: ``metrale_core.kernels``; used by every plugin's kernel-compile test.

Invariants:
- ``find_cu_files`` returns sorted absolute paths, so test ids are stable.
- ``compile_ptx`` passes ``-I`` for each of ``KERNEL_INCLUDE_DIRS``, so a raw ``.cu`` file finds
  the core's shared headers exactly where ``expand_includes`` (the NVRTC path) finds them.
- ``compile_ptx`` either returns the path of the written ``.ptx`` file or raises
  :class:`KernelCompileError` carrying nvcc's stderr; it never reports success on a failed build.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

from attrs import frozen

from metrale_core.errors import ConfigError, MetraleError
from metrale_core.kernels.cuda import KERNEL_INCLUDE_DIRS, expand_includes, kernel_path

__all__ = [
    "KernelCompileError",
    "RuntimeBuild",
    "compile_ptx",
    "compile_runtime_source",
    "find_cu_files",
    "nvcc_path",
    "ptx_entries",
]


class KernelCompileError(MetraleError):
    """nvcc rejected a kernel source; the message carries its stderr."""


def nvcc_path() -> str | None:
    """Path of ``nvcc`` on PATH, or ``None``."""
    return shutil.which("nvcc")


def _package_roots(package: str) -> list[Path]:
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise ConfigError(f"package {package!r} is not importable")
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    if spec.origin:
        return [Path(spec.origin).parent]
    raise ConfigError(f"package {package!r} has no location on disk")


def find_cu_files(package_or_root: str | Path) -> list[Path]:
    """Every ``.cu`` file under a directory, or under an importable package's directory."""
    candidate = Path(package_or_root)
    roots = [candidate] if candidate.is_dir() else _package_roots(str(package_or_root))
    found = {
        p.resolve() for root in roots for p in root.rglob("*.cu") if not any(part.startswith(".") for part in p.parts)
    }
    return sorted(found)


def compile_ptx(cu_path: str | Path, out_dir: str | Path, arch: str = "sm_90", options: tuple[str, ...] = ()) -> Path:
    """Compile ``cu_path`` to ``out_dir/<stem>.ptx`` with ``nvcc --ptx``; return the PTX path.

    Quoted includes resolve beside ``cu_path``, then in ``KERNEL_INCLUDE_DIRS`` (``-I``)."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise ConfigError("nvcc is not on PATH; install the CUDA toolkit to compile kernels")
    cu = Path(cu_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{cu.stem}.ptx"
    includes = [f"-I{d}" for d in KERNEL_INCLUDE_DIRS]
    cmd = [nvcc, "--ptx", f"-arch={arch}", "-std=c++17", *includes, *options, "-o", str(target), str(cu)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not target.is_file():
        raise KernelCompileError(
            f"nvcc failed on {cu} (exit {proc.returncode}):\n{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return target


_ENTRY = re.compile(r"\.entry\s+(\w+)")


def ptx_entries(ptx_text: str) -> list[str]:
    """The kernel entry points a PTX text exports, in order."""
    return _ENTRY.findall(ptx_text)


@frozen
class RuntimeBuild:
    """What :func:`compile_runtime_source` built: the inlined source and its PTX text."""

    source: str
    ptx: str

    @property
    def entries(self) -> list[str]:
        return ptx_entries(self.ptx)


def compile_runtime_source(
    package: str,
    filename: str,
    out_dir: str | Path,
    arch: str = "sm_90",
    options: tuple[str, ...] = ("-Werror", "all-warnings"),
) -> RuntimeBuild:
    """Compile exactly what NVRTC gets at run time: ``package``'s kernel ``filename`` with its
    quoted includes inlined (as ``load_raw_module`` does), warning-free by default."""
    source = expand_includes(kernel_path(package, filename))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flat = out / filename
    flat.write_text(source)
    ptx = compile_ptx(flat, out / "ptx", arch=arch, options=options).read_text()
    return RuntimeBuild(source=source, ptx=ptx)
