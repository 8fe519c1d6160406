"""``ReplicaClient``: the front's handle on one replica process, shaped like ``AsyncEngine``.

Owner: ``ReplicaPool`` makes one per replica process it starts; requests reach it through
``ReplicaPool.generate``.

It *is* an ``AsyncEngine`` (same ``generate`` / ``abort`` / ``shutdown``, same per-request
streams, coalescing of a consumer that falls behind, abort of a consumer that stops) whose
engine thread is replaced by a reader thread on the replica's pipe: ``add`` and ``abort`` go
down the pipe instead of into the engine thread's inbox, and the replica's step outputs come back
up it.  ``engine`` is the front's engine, used only to validate requests (``validate_request``:
the replica's engine has the same configuration, and queues the checked ``EngineRequest`` as it
is) and never stepped here.

Invariants:
- When the replica dies (its pipe reaches end of file), every request still streaming from it
  gets a final delta with ``finish_reason="error"`` and an error naming the replica and its exit
  status (never a hang), and ``on_exit`` is called once, from the reader thread.  A request sent
  after that fails the same way (the pipe is broken).
- ``stats`` is the replica's latest ``ReplicaReport``.
- A remote replica (``remote``) is the same client over a ``Link`` and a ``RemoteProcess``: its
  link ending is its process dying.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

from loguru import logger

from metrale_core.engine.async_engine import AsyncEngine
from metrale_core.engine.deltas import RequestOutput
from metrale_core.engine.request import EngineRequest

__all__ = ["ReplicaClient"]


class _PipeInbox:
    """Stands in for ``AsyncEngine``'s inbox: messages go down the replica's pipe."""

    def __init__(self, client: ReplicaClient) -> None:
        self.client = client
        self.lock = threading.Lock()

    def put(self, item: Any) -> None:
        if item is None:  # AsyncEngine.shutdown's wake-up: the reader thread needs none
            return
        try:
            with self.lock:
                self.client.conn.send(item)
        except (OSError, ValueError):  # the replica is gone (or its pipe closed)
            if isinstance(item, EngineRequest):
                self.client._send([(item.request_id, self.client.failure(item.request_id))])


class ReplicaClient(AsyncEngine):
    """See the module docstring."""

    def __init__(
        self,
        engine: Any,
        conn: Any,
        process: Any,
        index: int,
        stats: Any = None,
        on_exit: Callable[[ReplicaClient], None] | None = None,
    ) -> None:
        super().__init__(engine)
        self.conn = conn
        self.process = process
        self.index = index
        self.stats = stats
        self.on_exit = on_exit
        self._inbox = _PipeInbox(self)  # type: ignore[assignment]

    @property
    def serving(self) -> bool:
        """False once the replica is stopping or gone (before the pool has noticed)."""
        return not self._stop.is_set()

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe_exit(self) -> str:
        """``replica 1 (pid 123) died (exit code -9, SIGKILL)``; a remote replica:
        ``replica 1 (pid 123 on 10.0.0.2) lost: no message for 60s ...``."""
        code = self.process.exitcode
        where = getattr(self.process, "where", f"pid {self.pid}")
        if code is None:
            lost = getattr(self.process, "lost", None)  # a remote replica: why its link ended
            return f"replica {self.index} ({where}) " + (f"lost: {lost}" if lost else "stopped answering")
        why = f"exit code {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                why += f", {signal.Signals(-code).name}"
        return f"replica {self.index} ({where}) died ({why})"

    def failure(self, request_id: str) -> RequestOutput:
        """The final delta of a request lost with this replica."""
        return RequestOutput(
            request_id,
            finished=True,
            finish_reason="error",
            error=f"data-parallel {self.describe_exit()}; retry the request",
        )

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Ask the replica to stop (it aborts what is left and sends the final deltas), wait for
        it, and kill it if it does not exit in time."""
        self.request_stop()
        self.join(timeout)

    def request_stop(self) -> None:
        self._stop.set()
        self._inbox.put(("stop",))

    def join(self, timeout: float | None = 30.0) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            logger.warning("replica {} did not stop within {}s; killing it", self.index, timeout)
            self.process.kill()
            self.process.join(5)
        if self._thread is not None:
            self._thread.join(5)

    # --- reader thread (AsyncEngine's engine thread) ----------------------------------------
    def _run(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] == "out":
                    if msg[2] is not None:
                        self.stats = msg[2]
                    self._deliver(msg[1])
                elif msg[0] == "error":
                    self._send([(msg[1], msg[2])])
        except (EOFError, OSError):
            pass
        except Exception:
            logger.exception("replica {}: bad message; dropping the replica", self.index)
            self.process.kill()
        self._stop.set()
        self.process.join(5)
        with self._lock:
            lost = list(self._streams)
        if lost:
            logger.error("{}: failing its {} request(s)", self.describe_exit(), len(lost))
            self._send([(rid, self.failure(rid)) for rid in lost])
        self.conn.close()
        if self.on_exit is not None:
            self.on_exit(self)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand the replica's outputs to their consumers; abort the ones nobody listens to."""
        unfinished = {out.request_id for out in outputs if not out.finished}
        for request_id in self._send([(out.request_id, out) for out in outputs]):
            if request_id in unfinished:
                self.abort(request_id)
