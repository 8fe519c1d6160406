"""One data-parallel replica process: an ``LLMEngine`` driven by messages on a pipe.

Owner: ``ReplicaPool`` starts :func:`replica_main` in a spawned process per replica; the
front's ``ReplicaClient`` is the other end of the pipe.

Protocol (picklable tuples):
- front -> replica: an ``EngineRequest`` to add (checked once, by the front's engine: the
  replica queues it as it is), ``("abort", request_id)``, ``("stop",)``;
- replica -> front: ``("ready", pid, stats)`` once the engine is built (or
  ``("failed", reason)``), then ``("out", outputs, stats_or_None)`` per step with outputs and
  ``("error", request_id, exception)`` for a request the engine refused.  ``stats`` is a
  :class:`ReplicaReport`, sent at most every ``STATS_EVERY_S`` while busy and
  always when the engine goes idle.

Invariants:
- The replica sets its own torch thread count before building the engine.
- SIGINT is ignored: Ctrl-C reaches the whole process group, and the front alone decides when
  replicas stop (``("stop",)``: abort what is left, send the final deltas, exit).
- The front going away (its end of the pipe closed, even by SIGKILL) ends the replica: no
  orphans.
- A failing step fails only its requests (``step_or_fail``); the loop goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from attrs import evolve, frozen

from metrale_core.engine.async_engine import step_or_fail
from metrale_core.engine.block_manager import PrefixCacheStats
from metrale_core.engine.engine import EngineStats
from metrale_core.engine.request import EngineRequest
from metrale_core.engine.snapshot import EngineSnapshot
from metrale_core.errors import InvalidRequest

__all__ = ["STATS_EVERY_S", "ReplicaReport", "replica_main", "serve_replica"]

STATS_EVERY_S = 0.1


@frozen
class ReplicaReport:
    """What a replica tells the front about its engine (for ``/metrics`` and the dashboard)."""

    stats: EngineStats
    prefix: PrefixCacheStats
    #: The engine's latest snapshot, made picklable: plugin extras (whose formatters need not
    #: pickle) are left out.
    snapshot: EngineSnapshot


def _stats(engine: Any) -> ReplicaReport:
    snap = engine.snapshots.latest
    snap = evolve(snap, finish_reasons=dict(snap.finish_reasons), extras={}, extra_formats={})
    return ReplicaReport(engine.stats(), engine.scheduler.block_manager.prefix_cache_stats(), snap)


def replica_main(conn: Any, index: int, factory: Callable[[], Any], threads: int) -> None:
    """The replica process: build the engine with ``factory`` (an ``LLMEngine`` or anything with
    an ``.engine``), report ready, serve until stopped or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(threads)
    try:
        built = factory()
        engine = getattr(built, "engine", built)
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid(), _stats(engine)))
    with contextlib.suppress(EOFError, OSError):  # the front is gone
        serve_replica(conn, engine)


def serve_replica(conn: Any, engine: Any) -> None:
    """Run ``engine`` on the messages of ``conn`` until ``("stop",)`` or end of file."""
    last_stats = 0.0
    while True:
        busy = engine.has_unfinished()
        if conn.poll(0 if busy else None) and not _drain(conn, engine):
            _close(conn, engine)
            return
        if not engine.has_unfinished():
            continue
        outputs = step_or_fail(engine)
        now = time.monotonic()
        stats = None
        if now - last_stats >= STATS_EVERY_S or not engine.has_unfinished():
            stats, last_stats = _stats(engine), now
        if outputs or stats is not None:
            conn.send(("out", outputs, stats))
        if not outputs and engine.scheduler.last_plan.is_empty:
            conn.poll(0.01)  # nothing schedulable yet: wait a little for news


def _drain(conn: Any, engine: Any) -> bool:
    """Handle every waiting message; False on ``("stop",)`` (raises EOFError when orphaned)."""
    while conn.poll(0):
        msg = conn.recv()
        if not isinstance(msg, EngineRequest):
            if msg[0] == "stop":
                return False
            engine.abort(msg[1])  # ("abort", request_id)
            continue
        try:
            engine.add_request(msg)
        except Exception as exc:
            try:
                conn.send(("error", msg.request_id, exc))
            except Exception:
                conn.send(("error", msg.request_id, InvalidRequest(str(exc))))
    return True


def _close(conn: Any, engine: Any) -> None:
    """Abort what is left and send the final deltas."""
    for request_id in list(engine.scheduler.seqs):
        engine.abort(request_id)
    if engine.has_unfinished():
        conn.send(("out", engine.step(), _stats(engine)))
