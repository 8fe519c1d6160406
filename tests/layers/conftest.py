"""Fixtures shared by the layer tests: ``kernel_path``, each CPU path of the layer ops in turn."""

from __future__ import annotations

import pytest

from metrale_core.testing.requires import cpu_isa_params, use_kernel_path


@pytest.fixture(params=["native", *(f"cpu-{isa}" for isa in cpu_isa_params())])
def kernel_path(request, monkeypatch) -> str:
    """One CPU path forced for the test (``native``: torch; ``cpu-<isa>``: the C kernels of each
    variant the CPU runs); an op built in the test takes it. Returns the path's name."""
    use_kernel_path(monkeypatch, request.param, "metrale_core.layers")
    return request.param
