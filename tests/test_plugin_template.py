"""``met plugins new``: the template renders, installs with pip and its own tests pass."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

from metrale_core.cli.main import main
from metrale_core.cli.plugin_template import PluginNames, render_plugin
from metrale_core.errors import ConfigError


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True, text=True, timeout=300
    )


def test_names_are_validated_and_derived():
    names = PluginNames.parse("metrale-top-a")
    assert (names.name, names.dist, names.module) == ("top-a", "metrale-top-a", "metrale_top_a")
    for bad in ("Top_A", "-x", "9lives", "a--b", ""):
        with pytest.raises(ConfigError, match="lowercase letters"):
            PluginNames.parse(bad)


def test_cli_renders_the_template_and_refuses_to_overwrite(tmp_path, capsys):
    assert main(["plugins", "new", "top-a", "--dir", str(tmp_path)]) == 0
    target = tmp_path / "metrale-top-a"
    assert f"created {target}" in capsys.readouterr().out
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == [
        "README.md",
        "metrale_top_a/__init__.py",
        "metrale_top_a/processor.py",
        "pyproject.toml",
        "tests/test_metrale_top_a.py",
    ]
    pyproject = (target / "pyproject.toml").read_text()
    assert 'name = "metrale-top-a"' in pyproject and 'top-a = "metrale_top_a"' in pyproject
    assert "{{" not in "".join(p.read_text() for p in target.rglob("*") if p.is_file())
    assert main(["plugins", "new", "top-a", "--dir", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_rendered_plugin_installs_and_its_tests_pass(tmp_path):
    target = render_plugin("tpl-check", tmp_path)
    installed = pip("install", "--no-deps", "--no-build-isolation", "-e", str(target))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    try:
        # the generated tests include `met plugins` listing the new distribution
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
            cwd=target,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "3 passed" in run.stdout
    finally:
        removed = pip("uninstall", "-y", "metrale-tpl-check")
        assert removed.returncode == 0, removed.stderr
    importlib.invalidate_caches()
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("metrale-tpl-check")
