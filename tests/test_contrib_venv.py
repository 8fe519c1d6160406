"""A contrib plugin installed next to metrale-core in a fresh venv, then uninstalled.

Slow (a venv, the core with its dependencies, one plugin): run with ``pytest -m slow``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METRALE_PLUGINS", "VIRTUAL_ENV", "PYTHONPATH"))}
    proc = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**env, "METRALE_LOG": "warning"}
    )
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_contrib_plugin_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    met = str(venv / "bin" / "met")
    pip = (python, "-m", "pip", "--disable-pip-version-check", "-q")
    # torch first (the pinned CPU build); then the core with all its other dependencies
    run(*pip, "install", "-c", str(ROOT / "constraints.txt"), "torch==2.13.0")
    run(*pip, "install", "-c", str(ROOT / "constraints.txt"), str(ROOT))
    run(*pip, "install", str(ROOT / "contrib" / "metrale-slai"))

    listing = run(met, "plugins", cwd=tmp_path).stdout
    assert "metrale-slai" in listing and "schedulers: slai" in listing
    assert "--slai-max-wait-ms" in run(met, "generate", "--help", cwd=tmp_path).stdout
    # the template ships as package data of a regular (non-editable) install
    run(met, "plugins", "new", "probe", "--dir", str(tmp_path), cwd=tmp_path)
    assert (tmp_path / "metrale-probe" / "metrale_probe" / "processor.py").is_file()

    run(*pip, "uninstall", "-y", "metrale-slai")
    after = run(met, "plugins", cwd=tmp_path).stdout
    assert "metrale-slai" not in after and "schedulers: fcfs" in after
    assert "--slai-max-wait-ms" not in run(met, "generate", "--help", cwd=tmp_path).stdout
