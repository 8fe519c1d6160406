"""``metrale_core.testing.requires``: an absence skips on a developer's machine and fails under
``CI=true``; a C kernel library that cannot build on a capable CPU is such an absence."""

from __future__ import annotations

import pytest

from metrale_core.kernels import cpu as cpu_mod
from metrale_core.testing import requires

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    "value, strict", [("true", True), ("TRUE", True), ("1", True), ("", False), ("false", False), ("0", False)]
)
def test_strict_follows_ci(monkeypatch, value, strict):
    monkeypatch.setenv("CI", value)
    assert requires.strict() is strict


def test_missing_skips_locally_and_fails_under_ci(monkeypatch, tmp_path):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="absent"):
        requires.require_file(tmp_path / "model.gguf")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"CI=true and .*model.gguf is absent \(fetch it\)"):
        requires.require_file(tmp_path / "model.gguf", "fetch it")
    (tmp_path / "model.gguf").write_bytes(b"x")
    assert requires.require_file(tmp_path / "model.gguf") == tmp_path / "model.gguf"


def test_a_failed_kernel_build_on_a_capable_cpu_fails_under_ci(monkeypatch):
    monkeypatch.setattr(cpu_mod, "cpu_unavailable_reason", lambda package: "its avx2 C kernels could not be built")
    monkeypatch.setattr(cpu_mod, "cpu_capable", lambda: True)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="capable CPU: its avx2 C kernels could not be built"):
        requires.require_cpu_kernels("metrale_core.layers")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        requires.require_cpu_kernels("metrale_core.layers")
    # a CPU that runs no variant skips even under CI: nothing there could make the kernels run
    monkeypatch.setattr(cpu_mod, "cpu_capable", lambda: False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.skip.Exception):
        requires.require_cpu_kernels("metrale_core.layers")


def test_the_needs_file_marker_fails_under_ci(pytester, monkeypatch):
    pytester.makepyfile(
        test_x="""
        from metrale_core.testing.requires import needs_file

        @needs_file("/nonexistent/model.gguf", "fetch it")
        def test_needs():
            pass
    """
    )
    monkeypatch.delenv("CI", raising=False)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(skipped=1)
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # failed in setup: the run fails
    assert result.ret != 0 and "CI=true and /nonexistent/model.gguf is absent (fetch it)" in result.stdout.str()
