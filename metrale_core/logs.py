"""Loguru's sinks, set up in one place: stderr for the CLI, request lines at quiet levels, and a
dashboard's ring for as long as it runs.

Owner: ``metrale_core.cli.main`` (stderr at ``--log-level``), ``metrale_core.cli.serve`` (the
request lines when the level hides INFO) and ``metrale_core.tui.launch`` (the dashboard's log
ring).  No other module adds or removes a sink.

Invariants:
- Every sink has ``diagnose`` and ``backtrace`` off: a traceback never prints local variables
  (prompt text, token ids) nor frames above the catch point.
- :func:`to_stderr` replaces every sink with the one stderr sink; :func:`routed_to` replaces them
  with its sink for a ``with`` block and puts the stderr sink back after, at the same level.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from loguru import logger

__all__ = ["STDERR_FORMAT", "routed_to", "show_request_lines", "to_stderr"]

#: The stderr sink's line: time, level, message.
STDERR_FORMAT = "<green>{time:HH:mm:ss}</green> <level>{level: <7}</level> {message}"


def to_stderr(level: str) -> None:
    """Every log record at ``level`` or above to stderr, and nowhere else."""
    logger.remove()
    logger.add(sys.stderr, level=level.upper(), diagnose=False, backtrace=False, format=STDERR_FORMAT)


def show_request_lines(module: str) -> None:
    """Also print ``module``'s INFO records (one line per request) when the stderr level hides
    INFO (``--log-level warning`` or ``error``)."""
    logger.add(
        sys.stderr,
        level="INFO",
        format="<green>{time:HH:mm:ss}</green> {message}",
        diagnose=False,
        backtrace=False,
        filter=lambda record: record["name"] == module and record["level"].no < 30,
    )


@contextmanager
def routed_to(sink: Callable[[Any], None], level: str) -> Iterator[None]:
    """Every record at ``level`` or above to ``sink`` (plain messages) for the ``with`` block; the
    stderr sink at ``level`` after."""
    logger.remove()
    handler = logger.add(sink, level=level.upper(), format="{message}", diagnose=False, backtrace=False)
    try:
        yield
    finally:
        logger.remove(handler)
        to_stderr(level)
