"""Installed plugins as a user sees them: ``met plugins``, and a plugin's entry point and registry record.

Owner: the plugins' installed-and-registered tests.  Invariants: ``met plugins`` runs in a fresh
interpreter (``python -m metrale_core plugins``), so the listing comes from the installed entry
points, not from what the test process imported; a non-zero exit raises.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from typing import Any

__all__ = ["installed_plugin", "met_plugins_listing"]


def met_plugins_listing() -> str:
    """The standard output of ``met plugins`` in a fresh process."""
    argv = [sys.executable, "-m", "metrale_core", "plugins"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def installed_plugin(name: str, module: str, distribution: str) -> tuple[Any, Any]:
    """The registry and plugin ``name``'s record in it, after asserting that an entry point
    ``name`` (group ``metrale``) names ``module`` and that the plugin loaded from ``distribution``
    without an error."""
    from metrale_core.plugin.discovery import load_registry

    eps = importlib.metadata.entry_points(group="metrale")
    assert module in {ep.value for ep in eps if ep.name == name}
    registry = load_registry()
    info = {p.name: p for p in registry.plugins}[name]
    assert info.error is None and info.distribution == distribution, (info.error, info.distribution)
    return registry, info
