"""The terminal dashboard of ``met serve`` (Textual): header, start-up, stats, logs, chat, help.

``MetraleApp`` reads a :class:`ServerStatus` (the server's identity and start-up progress) and
the engine's published ``EngineSnapshot``; ``met serve`` runs it on a TTY
(:func:`metrale_core.tui.launch.use_dashboard` decides) and falls back to plain logs otherwise.
Textual is imported only when this package is.
"""

from __future__ import annotations

from metrale_core.tui.logring import LogRecord, LogRing
from metrale_core.tui.status import LoadProgress, Phase, ServerStatus

__all__ = ["LoadProgress", "LogRecord", "LogRing", "Phase", "ServerStatus"]
