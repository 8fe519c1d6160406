"""C kernels for the CPU path: build a package's ``kernels/cpu/*.c`` into one library per ISA
variant, load it, and bind its entry points from the package's headers.

Owner: ``metrale_core.kernels``.  ``CustomOp`` subclasses with ``cpu_kernels = True`` run their
``forward_cpu`` on the library of their ``kernel_package``; other code (a weight format's matmul)
calls :func:`cpu_library` directly.

ISA variants (:data:`CPU_VARIANTS`, best first): ``avx512`` (AVX512F/BW/VL/DQ + VNNI; the matmul
also uses AMX-INT8 tiles where the CPU has them) and ``avx2`` (AVX2 + FMA + F16C: every x86-64
desktop since 2013-2015).  The best variant the CPU runs is chosen, with the reason logged once;
``METRALE_CPU_ISA=avx512|avx2`` forces one (tests run the AVX2 build on AVX512 machines so both are
checked against the torch oracle).  Sources are compiled once per variant: ``metrale_cpu_math.h``
gives them vectors of ``MT_LANES`` floats, and a source written for one variant only guards itself
with the compiler's ISA macros.

Signatures -- one source of truth: the package's ``kernels/cpu/*.h`` declare every entry point;
the C files include their header, so the compiler rejects a definition that differs, and
:func:`bind_prototypes` parses the same headers with cffi's C parser (pycparser) and sets the
ctypes ``argtypes`` / ``restype`` from them.  Why cffi's parser feeding ctypes, rather than
cffi's ABI calls or ``torch.library``: the hot ops call C a few hundred times per decode step
with raw ``tensor.data_ptr()`` integers; ctypes takes those for ``void *`` arguments as they are,
whereas a cffi ABI call needs an ``ffi.cast`` per pointer argument, and ``torch.library``
registration needs a C++ extension build (torch headers, a C++ compiler, minutes of build) where
the system C compiler now takes a second.  The header is the one place a signature is written.

The sources are compiled with the system C compiler (``$CC``, else ``cc`` / ``gcc``) and
``CPU_CFLAGS`` plus the variant's flags into
``$METRALE_CACHE_DIR/cpu-kernels/<package>-<isa>-<hash>.so``, once per hash of the sources, the
headers and the flags.  OpenMP: the library is linked with ``-fopenmp`` (``NEEDED
libgomp.so.1``) and loaded with ctypes after torch; torch's CPU wheels ship their OpenMP runtime as
``torch/lib/libgomp.so.1`` with that same soname, so the dynamic loader resolves the library's
dependency to the runtime torch already loaded: one libgomp in the process, and torch's ops and
the C kernels share one thread pool per calling thread (proven by
``tests/kernels/test_cpu_openmp.py``).

Invariants:
- :func:`cpu_library` never raises: it returns None when the machine is not x86-64, the CPU lacks
  every variant (or the one ``METRALE_CPU_ISA`` forces), there is no compiler or the build fails,
  and :func:`cpu_unavailable_reason` then says why.  Callers keep their torch path.  A build that
  fails on a CPU that could run it is logged as a WARNING naming the compiler's reason.
- A library is built and loaded at most once per process, package and variant (thread-safe); the
  build writes to a temporary file and renames it, so concurrent builders never load a partial
  file.
- Every function a package header declares and its library exports has ctypes argtypes/restype
  set from the header before :func:`cpu_library` returns it.
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
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from loguru import logger

from metrale_core.loading.embedded import cache_dir

__all__ = [
    "CPU_CFLAGS",
    "CPU_ISA_ENV",
    "CPU_VARIANTS",
    "INCLUDE_DIR",
    "CpuVariant",
    "bind_prototypes",
    "build_cpu_library",
    "compiler",
    "cpu_capable",
    "cpu_flags",
    "cpu_headers",
    "cpu_isa",
    "cpu_library",
    "cpu_sources",
    "cpu_unavailable_reason",
    "parse_prototypes",
    "runnable_isas",
    "selected_isa",
]

INCLUDE_DIR = Path(__file__).parent / "include"
#: Flags of every build; each variant adds its ISA flags.
CPU_CFLAGS = ("-O3", "-std=c11", "-shared", "-fPIC", "-fopenmp")
#: Environment variable forcing an ISA variant (``avx512``, ``avx2``; unset/``auto``: the best).
CPU_ISA_ENV = "METRALE_CPU_ISA"


class CpuVariant:
    """One ISA variant of the C libraries: compiler flags and the ``/proc/cpuinfo`` flags needed."""

    def __init__(self, name: str, cflags: tuple[str, ...], cpu_needs: tuple[str, ...], label: str) -> None:
        self.name, self.cflags, self.cpu_needs, self.label = name, cflags, cpu_needs, label

    def __repr__(self) -> str:
        return f"CpuVariant({self.name})"


#: The variants, best first.
CPU_VARIANTS: dict[str, CpuVariant] = {
    "avx512": CpuVariant(
        "avx512",
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mf16c", "-mfma"),
        ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c", "fma"),
        "AVX512-VNNI",
    ),
    "avx2": CpuVariant("avx2", ("-mavx2", "-mfma", "-mf16c"), ("avx2", "fma", "f16c"), "AVX2+FMA+F16C"),
}

_lock = threading.Lock()
_libraries: dict[tuple[str, str], ctypes.CDLL | None] = {}
_reasons: dict[str, str] = {}
_logged: set[tuple[str, str]] = set()


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


def _x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def runnable_isas() -> list[str]:
    """The variants this CPU runs, best first (empty off x86-64)."""
    if not _x86_64():
        return []
    flags = cpu_flags()
    return [name for name, v in CPU_VARIANTS.items() if set(v.cpu_needs) <= flags]


def cpu_capable() -> bool:
    """Whether this CPU runs any variant (so a missing library is a build problem, not the CPU's)."""
    return bool(runnable_isas())


def selected_isa() -> tuple[str | None, str]:
    """``(variant, why)``: the variant :func:`cpu_library` loads now (None: none runs, ``why`` says
    why not)."""
    raw = os.environ.get(CPU_ISA_ENV, "").strip().lower()
    if raw not in ("", "auto") and raw not in CPU_VARIANTS:
        return None, f"{CPU_ISA_ENV}={raw!r} is not one of {', '.join(CPU_VARIANTS)} or 'auto'"
    if not _x86_64():
        return None, f"the CPU is {platform.machine()}, not x86-64"
    runnable = runnable_isas()
    if raw in CPU_VARIANTS:
        if raw in runnable:
            return raw, f"{CPU_ISA_ENV}={raw}"
        missing = [f for f in CPU_VARIANTS[raw].cpu_needs if f not in cpu_flags()]
        return None, f"{CPU_ISA_ENV}={raw} but the CPU lacks {', '.join(missing)}"
    if not runnable:
        missing = [f for f in CPU_VARIANTS["avx2"].cpu_needs if f not in cpu_flags()]
        return None, f"the CPU lacks {', '.join(missing)} (and AVX512-VNNI)"
    best = runnable[0]
    if best == "avx512":
        return best, "the CPU has AVX512-VNNI"
    return best, f"the CPU has {CPU_VARIANTS[best].label} but not AVX512-VNNI"


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else ``cc`` or ``gcc`` on PATH (None if none)."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


def _kernel_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "kernels" / "cpu"


def cpu_sources(package: str) -> list[Path]:
    """The ``kernels/cpu/*.c`` files of import package ``package`` (sorted; empty if none)."""
    root = _kernel_dir(package)
    return sorted(root.glob("*.c")) if root is not None else []


def cpu_headers(package: str) -> list[Path]:
    """The ``kernels/cpu/*.h`` files of ``package``: the declarations of its entry points."""
    root = _kernel_dir(package)
    return sorted(root.glob("*.h")) if root is not None else []


def build_cpu_library(sources: list[Path], name: str, out_dir: Path | None = None, isa: str = "avx512") -> Path:
    """Compile ``sources`` for variant ``isa`` into one shared library (unless the same build is
    cached) and return its path; raises ``RuntimeError`` with the compiler's message when it
    cannot."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (install gcc or set $CC)")
    if not sources:
        raise RuntimeError(f"{name} has no C sources")
    flags = (*CPU_CFLAGS, *CPU_VARIANTS[isa].cflags)
    digest = hashlib.sha256(" ".join((cc, *flags)).encode())
    headers = sorted({h for s in sources for h in s.parent.glob("*.h")} | set(INCLUDE_DIR.glob("*.h")))
    for path in [*sources, *headers]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    out_dir = Path(out_dir) if out_dir is not None else cache_dir() / "cpu-kernels"
    lib = out_dir / f"{name}-{isa}-{digest.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    logger.info("building the {} C CPU kernels of {} (once per version, a few seconds)", isa, name)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_lib = Path(tmp) / lib.name
        command = [cc, *flags, f"-I{INCLUDE_DIR}", *map(str, sources), "-o", str(tmp_lib), "-lm"]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{Path(cc).name} failed on {', '.join(s.name for s in sources)}:\n{proc.stderr.strip()[-3000:]}"
            )
        os.replace(tmp_lib, lib)
    return lib


# --- signatures from the headers ---------------------------------------------------------------

_CTYPES = {
    "int": ctypes.c_int,
    "unsigned int": ctypes.c_uint,
    "long": ctypes.c_long,
    "long long": ctypes.c_longlong,
    "int8_t": ctypes.c_int8,
    "uint8_t": ctypes.c_uint8,
    "int16_t": ctypes.c_int16,
    "uint16_t": ctypes.c_uint16,
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "void": None,
}


def _ctype(t) -> type | None:
    """The ctypes type for cffi type ``t``: every pointer is ``c_void_p`` (callers pass
    ``data_ptr()`` integers), scalars map one to one; anything else is refused."""
    if t.kind == "pointer":
        return ctypes.c_void_p
    if t.kind in ("primitive", "void"):
        name = t.cname
        if name in _CTYPES:
            return _CTYPES[name]
    raise TypeError(f"C type {t.cname!r} has no ctypes binding here")


_DECLARATION = re.compile(r"^(?P<ret>.*?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<args>.*)\)$", re.S)


def parse_prototypes(headers: list[Path]) -> dict[str, tuple[type | None, tuple[type | None, ...]]]:
    """``{function: (restype, argtypes)}`` of every function the ``headers`` declare.

    The headers are plain C declarations (preprocessor lines and comments are dropped).  Each
    declaration ``R name(A)`` is handed to cffi's C parser as ``typedef R (*name)(A)``, so cffi
    parses every type; a declaration cffi cannot parse raises ``cffi.CDefError``."""
    import cffi

    text = "\n".join(line for h in headers for line in h.read_text().splitlines() if not line.lstrip().startswith("#"))
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    ffi = cffi.FFI()
    names = []
    for decl in filter(None, (d.strip() for d in text.split(";"))):
        m = _DECLARATION.match(decl)
        if m is None:
            raise ValueError(f"not a function declaration: {decl!r}")
        names.append(m["name"])
        ffi.cdef(f"typedef {m['ret']} (*{m['name']})({m['args']});")
    out: dict[str, tuple[type | None, tuple[type | None, ...]]] = {}
    for name in names:
        fn = ffi.typeof(name)  # cffi spells a function pointer type as kind "function"
        out[name] = (_ctype(fn.result), tuple(_ctype(a) for a in fn.args))
    return out


def bind_prototypes(lib: ctypes.CDLL, headers: list[Path]) -> dict[str, tuple]:
    """Set ``argtypes`` / ``restype`` of every function of ``lib`` that ``headers`` declare;
    returns the parsed prototypes (functions the library lacks are skipped: a variant may omit
    functions its header marks for another ISA)."""
    prototypes = parse_prototypes(headers) if headers else {}
    for name, (restype, argtypes) in prototypes.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue
        fn.restype, fn.argtypes = restype, list(argtypes)
    return prototypes


# --- loading -----------------------------------------------------------------------------------


def _log_once(package: str, isa: str, level: str, message: str, *args) -> None:
    if (package, message) not in _logged:
        _logged.add((package, message))
        logger.log(level, message, *args)


def _load(package: str, isa: str) -> ctypes.CDLL | None:
    import torch  # noqa: F401  -- load torch's libgomp first, so the library shares it

    try:
        lib = ctypes.CDLL(str(build_cpu_library(cpu_sources(package), package, isa=isa)))
        bind_prototypes(lib, cpu_headers(package))
        return lib
    except Exception as exc:
        _reasons[package] = f"its {isa} C kernels could not be built: {exc}"
        _log_once(
            package,
            isa,
            "WARNING",
            "the C CPU kernels of {} fall back to torch although the CPU could run them ({}): {}",
            package,
            CPU_VARIANTS[isa].label,
            exc,
        )
        return None


def cpu_library(package: str) -> ctypes.CDLL | None:
    """The loaded C library of ``package`` for the selected variant (built on first use), or None
    where it cannot run."""
    isa, why = selected_isa()
    with _lock:
        if isa is None:
            _reasons[package] = why
            return None
        if (package, isa) not in _libraries:
            lib = _libraries[(package, isa)] = _load(package, isa)
            if lib is not None:
                _log_once(package, isa, "INFO", "C CPU kernels of {}: the {} build ({})", package, isa, why)
        return _libraries[(package, isa)]


def cpu_isa(package: str) -> str | None:
    """The variant of the library :func:`cpu_library` returns for ``package`` (None: none)."""
    return selected_isa()[0] if cpu_library(package) is not None else None


def cpu_unavailable_reason(package: str) -> str | None:
    """Why :func:`cpu_library` is None for ``package`` (None when it is available)."""
    if cpu_library(package) is not None:
        return None
    return _reasons.get(package, "unknown")
