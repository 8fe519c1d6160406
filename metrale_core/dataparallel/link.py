"""``Link``: a replica protocol connection to another host, with heartbeats and a silence bound.

Owner: ``metrale_core.dataparallel.remote`` wraps both ends of a remote replica's TCP connection
(the front's and ``met replica``'s) in one; ``ReplicaClient`` and ``serve_replica`` use it as they
use a local replica's pipe (``send`` / ``recv`` / ``poll`` / ``close``).

Why: a link that goes down closes no socket, so a pipe-style connection would wait forever for
a peer that can no longer answer.

Invariants:
- Each end sends a ``("ping",)`` whenever it has sent nothing for a quarter of ``timeout_s``;
  pings are consumed here and never reach the caller.
- A peer silent for ``timeout_s`` (not even a ping) is lost -- judged only after reading what
  already arrived, so a reader that comes late (a replica building its engine, the front busy
  starting another replica) never mistakes queued messages for silence: ``poll`` returns True and ``recv``
  raises ``EOFError`` (what a closed pipe does), :attr:`why` says what happened and
  :attr:`ended` is set.  A send blocked for ``timeout_s`` (the peer stopped reading, or the link
  is down with a full buffer) raises ``OSError`` instead of hanging (``SO_SNDTIMEO``), and so does
  a message cut off mid-way (``SO_RCVTIMEO``).
- ``poll`` and ``recv`` are called from one thread; ``send`` from any (serialized here).
  :meth:`shut` (any thread) wakes a blocked reader with end of file; :meth:`close` frees the fd.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections import deque
from typing import Any

__all__ = ["PING", "Link"]

PING = ("ping",)


class Link:
    """See the module docstring."""

    def __init__(self, conn: Any, timeout_s: float, peer: str) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        #: ``host:port`` of the other end.
        self.peer = peer
        #: Why the link ended (None while it is up).
        self.why: str | None = None
        self.ended = threading.Event()
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))  # same socket, for options/shutdown
        self._send_lock = threading.Lock()
        self._pending: deque[Any] = deque()
        self._last_seen = self._last_sent = time.monotonic()
        self.set_timeout(timeout_s)
        threading.Thread(target=self._beat, name="metrale-link-heartbeat", daemon=True).start()

    def set_timeout(self, timeout_s: float) -> None:
        """Change the silence bound (the far end learns the job's from the first message)."""
        self.timeout_s = timeout_s
        secs = int(timeout_s)
        value = struct.pack("ll", secs, int((timeout_s - secs) * 1e6))
        for option in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):  # a send or a half-read message
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, option, value)

    # --- the connection's interface ------------------------------------------------------------
    def send(self, obj: Any) -> None:
        with self._send_lock:
            try:
                self.conn.send(obj)
            except OSError as exc:  # a send that timed out, or a closed socket: the link is gone
                self._end(f"a send failed ({exc}): its host or link is down, or it stopped reading")
                raise
            self._last_sent = time.monotonic()

    def poll(self, timeout: float | None = 0.0) -> bool:
        """True when a message (or the end of the link) is there, within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (self._pending or self.ended.is_set()):
            silent_until = self._last_seen + self.timeout_s
            until = silent_until if deadline is None else min(silent_until, deadline)
            try:  # what already arrived is read before any silence is judged (a reader may come late)
                ready = self.conn.poll(max(0.0, until - time.monotonic()))
                msg = self.conn.recv() if ready else None
            except (EOFError, OSError):
                self._end("the connection was closed")
                break
            if ready:
                self._last_seen = time.monotonic()
                if msg != PING:
                    self._pending.append(msg)
                continue
            if time.monotonic() >= silent_until:
                self._end(
                    f"no message for {self.timeout_s:g}s (--distributed-timeout): its host or link is down, or it hangs"
                )
                break
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def recv(self) -> Any:
        self.poll(None)
        if self._pending:
            return self._pending.popleft()
        raise EOFError(self.why)

    def shut(self) -> None:
        """End the link from this side (the peer and a blocked reader see end of file)."""
        self._end("closed by this side")
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.shut()
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(OSError):
            self.conn.close()

    # --- internals -------------------------------------------------------------------------------
    def _end(self, why: str) -> None:
        if self.why is None:
            self.why = why
        self.ended.set()

    def _beat(self) -> None:
        while not self.ended.is_set():
            interval = max(0.05, self.timeout_s / 4)
            time.sleep(interval)
            if time.monotonic() - self._last_sent < interval:
                continue
            try:
                self.send(PING)
            except (OSError, ValueError):
                return  # the reader sees the end (closed socket, or silence)
