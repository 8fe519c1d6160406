"""Skips that cannot hide breakage: a test that needs something the machine may lack calls these.

Owner: tests of metrale-core and of every plugin.  On a developer's machine a missing real-model
file, test data set or C kernel library skips the test with the reason.  Under ``CI=true`` (set by
every CI system we know, and by ``.ci/run``'s callers) the same absence FAILS the test: CI is where
the data were fetched and the kernels must build, so an absence there is breakage, not an option.

Invariants:
- :func:`strict` is true exactly when ``CI`` is ``true``/``1``/``yes`` (case-insensitive).
- :func:`missing` never returns: it calls ``pytest.skip`` or ``pytest.fail``.
- :func:`require_cpu_kernels` skips (even under CI) only where the CPU cannot run any C variant
  (not x86-64, no AVX2/FMA/F16C) -- the one absence CI cannot fix; a failed build, a missing
  compiler or ``METRALE_CPU_ISA`` naming an ISA the CPU lacks fail under CI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

__all__ = [
    "cpu_isa_params",
    "missing",
    "needs_file",
    "require_cpu_kernels",
    "require_file",
    "strict",
    "use_cpu_isa",
    "use_kernel_path",
]


def strict() -> bool:
    """Whether absences fail instead of skipping (``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(what: str) -> NoReturn:
    """Skip the calling test because ``what`` is missing -- or fail it under ``CI=true``."""
    if strict():
        pytest.fail(f"CI=true and {what}", pytrace=False)
    pytest.skip(what)


def require_file(path: Path | str, hint: str = "") -> Path:
    """``path`` if it is a file, else :func:`missing` (``hint``: how to get it)."""
    path = Path(path)
    if not path.is_file():
        missing(f"{path} is absent" + (f" ({hint})" if hint else ""))
    return path


def needs_file(path: Path | str, hint: str = "") -> pytest.MarkDecorator:
    """A mark for tests that need file ``path``: :func:`require_file` runs at their setup (the
    ``metrale`` pytest plugin's hook), so they skip where it is absent and fail under CI."""
    return pytest.mark.metrale_needs_file(Path(path), hint)


def require_cpu_kernels(package: str) -> None:
    """Return when ``package``'s C CPU library runs here; else skip where the CPU cannot run it
    at all, and :func:`missing` (fail under CI) where it could but the build or load failed."""
    from metrale_core.kernels.cpu import cpu_capable, cpu_unavailable_reason

    reason = cpu_unavailable_reason(package)
    if reason is None:
        return
    if not cpu_capable():
        pytest.skip(f"C CPU kernels of {package}: {reason}")
    missing(f"the C CPU kernels of {package} do not run on this capable CPU: {reason}")


def cpu_isa_params() -> list[str]:
    """The C kernel variants to parametrize a test over: every one this CPU runs (``avx512`` and
    ``avx2`` on an AVX512-VNNI machine), or ``["none"]`` where it runs none (the test then skips
    through :func:`use_cpu_isa`)."""
    from metrale_core.kernels.cpu import runnable_isas

    return runnable_isas() or ["none"]


def use_cpu_isa(monkeypatch: pytest.MonkeyPatch, isa: str, package: str) -> None:
    """Force variant ``isa`` (``METRALE_CPU_ISA``) for the rest of the test and require that
    ``package``'s library runs in it (:func:`require_cpu_kernels`)."""
    from metrale_core.kernels.cpu import CPU_ISA_ENV

    if isa == "none":
        monkeypatch.delenv(CPU_ISA_ENV, raising=False)
    else:
        monkeypatch.setenv(CPU_ISA_ENV, isa)
    require_cpu_kernels(package)


def use_kernel_path(monkeypatch: pytest.MonkeyPatch, path: str, package: str) -> None:
    """Force one CPU path for the rest of the test: ``"native"`` (torch) or ``"cpu-<isa>"``, the C
    kernels of ``package`` in variant ``<isa>`` (:func:`use_cpu_isa`, as :func:`cpu_isa_params`
    names them), through ``METRALE_KERNELS``."""
    from metrale_core.kernels import KERNELS_ENV

    if path.startswith("cpu-"):
        use_cpu_isa(monkeypatch, path.removeprefix("cpu-"), package)
        path = "cpu"
    monkeypatch.setenv(KERNELS_ENV, path)
