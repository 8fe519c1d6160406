"""Metrale core: engine, plugin machinery, weights, sampling and CLI.

Plugin authors import only from ``metrale_core`` (and the modules it names in ``__all__``).
"""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

#: Marker to be imported and used by plugins: ``@metrale_core.hookimpl``.
hookimpl = pluggy.HookimplMarker("metrale")

__all__ = ["__version__", "hookimpl"]
