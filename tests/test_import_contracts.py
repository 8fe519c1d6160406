"""The import-linter contracts in ``pyproject.toml`` hold for the whole tree, and they can fail.

Contracts: core never imports a plugin; plugins and contrib import only ``metrale_core.api`` (and
the package root); core's layers (cli > tui > server > engine | layers > model_api) never import
upward.  ``lint-imports`` runs here so CI enforces them.
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import tomllib

import metrale_core

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
CONTRACTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


#: Every in-tree distribution's folder: import-linter reads sources, so a plugin need not be
#: installed (the per-distribution tox envs install only some) to be checked.
SOURCE_PATH = [
    str(REPO),
    *(
        str(d)
        for folder in ("plugins", "contrib")
        for d in sorted((REPO / folder).iterdir())
        if (d / "pyproject.toml").is_file()
    ),
]


def _lint(cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )


def test_every_contract_is_kept():
    proc = _lint(REPO, {**os.environ, "PYTHONPATH": os.pathsep.join(SOURCE_PATH)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout and "0 broken" in proc.stdout


def test_plugins_root_packages_cover_every_distribution():
    """Each plugin/contrib package is a root package and a source of the public-API contract."""
    packages = {
        p.name
        for folder in ("plugins", "contrib")
        for dist in (REPO / folder).iterdir()
        for p in dist.glob("metrale_*")
        if (p / "__init__.py").is_file()
    }
    public = next(c for c in CONTRACTS["contracts"] if c["id"] == "plugins-import-only-the-public-api")
    assert packages <= set(CONTRACTS["root_packages"])
    assert packages == set(public["source_modules"])


def test_every_private_core_module_is_forbidden_to_plugins():
    """A new core module is private (forbidden to plugins) until metrale_core.api names it."""
    children = {f"metrale_core.{m.name}" for m in pkgutil.iter_modules(metrale_core.__path__)}
    public = next(c for c in CONTRACTS["contracts"] if c["id"] == "plugins-import-only-the-public-api")
    assert set(public["forbidden_modules"]) == children - {"metrale_core.api", "metrale_core.__main__"}


def test_a_plugin_reaching_into_core_breaks_the_contract(tmp_path):
    """The same contract on a throw-away plugin that imports ``metrale_core.engine`` fails."""
    pkg = tmp_path / "metrale_bad_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from metrale_core.api import hookimpl\n")
    (pkg / "impl.py").write_text("from metrale_core.engine.runner import model_device\n")
    (tmp_path / ".importlinter").write_text(
        textwrap.dedent("""\
        [importlinter]
        root_packages =
            metrale_core
            metrale_bad_plugin

        [importlinter:contract:public]
        name = plugins import only metrale_core.api
        type = forbidden
        source_modules = metrale_bad_plugin
        forbidden_modules = metrale_core.engine
        allow_indirect_imports = true
        """)
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = _lint(tmp_path, env)
    assert proc.returncode != 0
    assert "metrale_bad_plugin.impl -> metrale_core.engine.runner" in proc.stdout
