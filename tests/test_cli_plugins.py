"""``met plugins`` with a plugin that raises at import: reported by name and skipped; with
``METRALE_STRICT_PLUGINS=1`` the command fails with a one-line error naming it.

The broken distribution is a fake ``*.dist-info`` on ``PYTHONPATH`` (see tests/plugin/test_discovery.py),
so discovery runs through ``importlib.metadata`` as for a pip install, in a real ``met`` process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "fake_plugins"


@pytest.fixture
def broken_site(tmp_path) -> Path:
    info = tmp_path / "fakebroken-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakebroken\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text("[metrale]\nbroken = fake_broken_plugin\n")
    shutil.copy(DATA / "fake_broken_plugin.py", tmp_path / "fake_broken_plugin.py")
    return tmp_path


def met(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("METRALE_PLUGINS", "METRALE_DISABLE_PLUGINS", "METRALE_STRICT_PLUGINS")
    }
    environ.update(PYTHONPATH=str(site), METRALE_LOG="warning", **env)
    return subprocess.run(
        [sys.executable, "-m", "metrale_core", *args], capture_output=True, text=True, timeout=120, env=environ
    )


def test_broken_plugin_is_reported_by_name_and_skipped(broken_site):
    proc = met(broken_site, "plugins")
    assert proc.returncode == 0, proc.stderr
    assert "'broken' from fakebroken 2.0 failed to import" in proc.stderr
    assert "needs libfoo" in proc.stderr and "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("broken "))
    assert "fakebroken" in lines[row] and lines[row].rstrip().endswith("failed")
    assert "error: ImportError: fake_broken_plugin needs libfoo" in lines[row + 1]
    assert any(line.startswith("builtins ") for line in lines)  # everything else still loads
    data = {p["name"]: p for p in json.loads(met(broken_site, "plugins", "--json").stdout)}
    assert data["broken"]["status"] == "failed" and data["builtins"]["status"] == "loaded"


def test_strict_mode_turns_it_into_a_one_line_error(broken_site):
    proc = met(broken_site, "plugins", METRALE_STRICT_PLUGINS="1")
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("met: error:")]
    assert "'broken' from fakebroken 2.0 failed to import" in line
    assert "needs libfoo" in line and "METRALE_STRICT_PLUGINS" in line


def test_disabling_the_broken_plugin_silences_it(broken_site):
    proc = met(broken_site, "plugins", METRALE_STRICT_PLUGINS="1", METRALE_DISABLE_PLUGINS="broken")
    assert proc.returncode == 0, proc.stderr
    assert "libfoo" not in proc.stderr
    assert "blocked by METRALE_DISABLE_PLUGINS" in proc.stdout
