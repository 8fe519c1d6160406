"""Give freed heap memory back to the OS after large requests (glibc's allocator high-water).

Owner: ``common.read_request`` calls :func:`after_large_body` for bodies of at least
:data:`TRIM_ABOVE_BYTES`.

Why: a large request (a multi-megabyte prompt) makes the JSON decoder, the template and the
tokenizer allocate and free a lot of small blocks; glibc keeps the freed memory in its arenas,
so RSS stays at the high-water mark although nothing leaks (measured in the issue-16 soak:
``bench/soak_http.py``).  ``malloc_trim(0)`` returns the free pages at the top and inside each
arena.  It walks every arena, so it runs only after large bodies and at most once per
:data:`MIN_INTERVAL_S`, on a frontend worker thread (never on the event loop).

Invariant: a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

__all__ = ["MIN_INTERVAL_S", "TRIM_ABOVE_BYTES", "after_large_body", "trim"]

TRIM_ABOVE_BYTES = 1 << 20
MIN_INTERVAL_S = 1.0

_lock = threading.Lock()
_last = 0.0
_libc = None
try:
    _name = ctypes.util.find_library("c")
    if _name:
        _candidate = ctypes.CDLL(_name)
        if hasattr(_candidate, "malloc_trim"):
            _libc = _candidate
except OSError:  # pragma: no cover - no C library to load
    _libc = None


def trim() -> bool:
    """``malloc_trim(0)``; True when glibc released something."""
    if _libc is None:
        return False
    return bool(_libc.malloc_trim(0))


def after_large_body(size: int) -> None:
    """Trim after a request body of ``size`` bytes, when large and not trimmed just now."""
    global _last
    if size < TRIM_ABOVE_BYTES or _libc is None:
        return
    with _lock:
        now = time.monotonic()
        if now - _last < MIN_INTERVAL_S:
            return
        _last = now
    trim()
