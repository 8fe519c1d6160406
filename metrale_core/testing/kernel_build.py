"""What every package's kernel tests check of a runtime build: the core's headers inlined once.

Owner: the kernel-compile tests of metrale-core's layers and of the plugins that ship ``.cu``
files (fp8, glm-kda, qwen3's compile sweep); each keeps its own table of kernels and entry points.

Invariants:
- :data:`needs_nvcc` skips a test exactly where ``nvcc`` is not on ``PATH``.
- :func:`assert_inlined_once` passes only for the source NVRTC gets at run time: no ``#include``
  left, the core's ``metrale_bf16.cuh`` and ``metrale_reduce.cuh`` each present exactly once, PTX
  for ``sm_90``, and every name of ``entries`` exported.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from metrale_core.kernels import nvcc_path

__all__ = ["assert_inlined_once", "needs_nvcc"]

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not on PATH")


def assert_inlined_once(build: Any, entries: Iterable[str]) -> None:
    """``build`` (a :class:`metrale_core.kernels.ptx.RuntimeBuild`) is a flat sm_90 source with the
    core's headers once and exports ``entries``."""
    assert "#include" not in build.source
    assert build.source.count("struct bf16 {") == 1  # the core's metrale_bf16.cuh, once
    assert build.source.count("float neg_inf() {") == 1  # the core's metrale_reduce.cuh, once
    assert build.source.count("float warp_sum(float v) {") == 1
    assert ".target sm_90" in build.ptx
    assert set(entries) <= set(build.entries), (sorted(entries), build.entries)
