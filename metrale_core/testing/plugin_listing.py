"""``met plugins`` as a user runs it, for the installed-plugin tests of contrib and plugins.

Owner: the plugins' ``test_plugin_is_installed`` tests.  Invariants: a fresh interpreter
(``python -m metrale_core plugins``), so the listing comes from the installed entry points, not
from what the test process imported; a non-zero exit raises.
"""

from __future__ import annotations

import subprocess
import sys

__all__ = ["met_plugins_listing"]


def met_plugins_listing() -> str:
    """The standard output of ``met plugins`` in a fresh process."""
    argv = [sys.executable, "-m", "metrale_core", "plugins"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
