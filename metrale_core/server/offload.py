"""Run CPU-heavy request work (JSON parsing, chat-template rendering, tokenization) off the
event loop, on a small bounded pool of worker threads.

Owner: the chat, completions and tokenize routes (``await off_loop(fn, *args)``).

Invariants:
- The event loop never runs a tokenizer or a template: ``/health`` and every stream stay
  responsive while a large prompt is being tokenized.
- At most :data:`WORKERS` such jobs run at once; more wait their turn in the pool's queue
  (admission control bounds how many requests can be waiting).
- The pool's threads never run torch ops (so they keep no OpenMP thread team; see
  ``host._in_own_thread``).  A runaway chat template is stopped by the template's own time
  budget (``metrale_core.chat_template``), so a worker is never lost for good.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["WORKERS", "off_loop"]

WORKERS = 4

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="metrale-frontend")
        return _pool


async def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a frontend worker thread."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))
