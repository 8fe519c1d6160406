"""Thread pools made on first use and shared by everyone who asks for them.

Owner: the modules that run work beside the caller: ``layers.formats.gguf_repack`` (repacking
GGUF blocks while a model loads) and ``server.offload`` (request work kept off the event loop).

Invariants:
- :meth:`LazyThreadPool.get` creates the executor at most once, under a lock, so threads that ask
  at the same moment share one pool; nothing is started before the first call.
- The worker count is read when the pool is made (a callable may size it from the machine).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["LazyThreadPool"]


class LazyThreadPool:
    """A :class:`ThreadPoolExecutor` of ``workers`` threads named ``prefix-N``, made on first use."""

    def __init__(self, workers: int | Callable[[], int], prefix: str) -> None:
        self._workers = workers
        self._prefix = prefix
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        """The pool, made now if this is the first call."""
        with self._lock:
            if self._pool is None:
                workers = self._workers() if callable(self._workers) else self._workers
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=self._prefix)
            return self._pool
