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

__all__ = ["missing", "require_cpu_kernels", "require_file", "strict"]


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
