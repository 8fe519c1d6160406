"""Run CPU-heavy request work off the event loop: on a small bounded pool of worker threads
(JSON parsing, chat-template rendering, tokenization), or on a thread of its own (anything that
runs torch ops: loading a model or an adapter).

Owner: the chat, completions and tokenize routes (``await off_loop(fn, *args)``); the host's model
load and the LoRA load route (``await in_own_thread(fn)``).

Invariants:
- The event loop never runs a tokenizer or a template: ``/health`` and every stream stay
  responsive while a large prompt is being tokenized.
- At most :data:`WORKERS` such jobs run at once; more wait their turn in the pool's queue
  (admission control bounds how many requests can be waiting).
- The pool's threads never run torch ops.  A thread that has run one keeps an OpenMP thread team
  for as long as it lives (torch starts it on the thread's first op), and with a second team alive
  libgomp counts more threads than CPUs and cuts every team's spin-wait short: the engine
  thread's forward then sleeps and wakes between its ~300 parallel regions a step and decodes at
  half speed (SmolLM2 189 -> 79 tok/s on 2 cores).  Torch work goes to :func:`in_own_thread`,
  whose thread (and team) ends with the work.
- A runaway chat template is stopped by the template's own time budget
  (``metrale_core.text.chat_template``), so a worker is never lost for good.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from typing import Any

from metrale_core.pools import LazyThreadPool

__all__ = ["WORKERS", "in_own_thread", "off_loop"]

WORKERS = 4

_FRONTEND_POOL = LazyThreadPool(WORKERS, "metrale-frontend")


async def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a frontend worker thread."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_FRONTEND_POOL.get(), functools.partial(fn, *args, **kwargs))


async def in_own_thread(fn: Callable[[], Any], name: str = "metrale-loader") -> Any:
    """``await fn()`` run on a new thread that exits when ``fn`` returns (see the invariants)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:
            result, error = None, exc
        loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
