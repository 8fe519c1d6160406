"""A lean streaming client for the serving benchmarks: POST, then time the SSE events as they come.

Owner: ``bench/bench_serve.py`` (both servers' streaming figures).  Not a test, not an API.

Why not httpx: on a 2-core machine the client shares the cores with the server it measures, and
httpx (line splitting, ``json.loads`` of every event, its own state machines) spends ~120 us of
CPU per streamed token at 16 streams, more than ``met serve``'s own event loop.  That CPU was
charged to whichever server was measured, so a server path's cost could not be told from the
client's.  This client is an ``asyncio.Protocol``: each socket read is handled in
``data_received`` (no stream reader, no task wake-up per read), the chunked framing undone in
place, and it only looks for the event boundaries and whether an event carries text.

Invariants:
- One request per connection at a time; a connection is reused (HTTP/1.1 keep-alive) only after
  its response was read to the end, and a kept-alive connection the server closed is retried once
  on a fresh one.
- A non-200 status or an event carrying ``"error"`` raises :class:`StreamFailed` with the text.
- The times are ``time.perf_counter()`` at the read that brought the first and the last event with
  text: events coalesced into one read share its time.
"""

from __future__ import annotations

import asyncio
import json
import time

__all__ = ["SSEClient", "StreamFailed"]

NAN = float("nan")


class StreamFailed(RuntimeError):
    """The server answered with an error status or an error event."""


class _Closed(ConnectionError):
    """The server closed the connection before the response ended."""


class SSEClient:
    """Keep-alive connections to one ``host:port``; :meth:`stream` POSTs and times the events."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._idle: list[_Connection] = []

    async def stream(self, path: str, body: dict) -> tuple[float, float, float, int]:
        """``(sent, first text event, last text event, text events)`` of one streamed request."""
        fresh = not self._idle
        try:
            return await self._stream_once(path, body)
        except _Closed:
            if fresh:
                raise
            self._drop_idle()
            return await self._stream_once(path, body)

    def _drop_idle(self) -> None:
        while self._idle:
            self._idle.pop().transport.close()

    async def _stream_once(self, path: str, body: dict) -> tuple[float, float, float, int]:
        if self._idle:
            conn = self._idle.pop()
        else:
            _, conn = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        sent = time.perf_counter()
        first, last, count, keep_alive = await conn.request(head + payload)
        if keep_alive:
            self._idle.append(conn)
        else:
            conn.transport.close()
        return sent, first, last, count


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection read straight from ``data_received``: no stream reader, no task
    wake-up per read, the framing undone in place."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._done: asyncio.Future | None = None
        self._lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self._lost = True
        if self._done is not None and not self._done.done():
            self._done.set_exception(_Closed("the server closed the connection mid-response"))

    def request(self, raw: bytes) -> asyncio.Future:
        """Send ``raw``; the future gives ``(first, last, text events, keep-alive)``."""
        self._done = asyncio.get_running_loop().create_future()
        if self._lost:
            self._done.set_exception(_Closed("the kept-alive connection was closed"))
            return self._done
        self._head: bytes | None = b""
        self._keep_alive = True
        self._framed = self._events = b""
        self._first = self._last = NAN
        self._count = 0
        self.transport.write(raw)
        return self._done

    def data_received(self, data: bytes) -> None:
        if self._done is None or self._done.done():
            return
        try:
            if self._head is not None:
                self._head += data
                end = self._head.find(b"\r\n\r\n")
                if end < 0:
                    return
                status, self._keep_alive, chunked = _head(self._head[:end])
                data, self._head = self._head[end + 4 :], None
                if status != 200 or not chunked:
                    raise StreamFailed(f"HTTP {status} (chunked: {chunked})")
            if self._read(data):
                self._done.set_result((self._first, self._last, self._count, self._keep_alive))
        except Exception as exc:
            self._done.set_exception(exc)
            self.transport.close()

    def _read(self, data: bytes) -> bool:
        """Take in one read; True once the body's last chunk came."""
        now = time.perf_counter()
        self._framed += data
        ended = False
        while True:  # undo the chunked framing of every complete chunk
            eol = self._framed.find(b"\r\n")
            if eol < 0:
                break
            size = int(self._framed[:eol].split(b";")[0], 16)
            end = eol + 2 + size + 2
            if len(self._framed) < end:
                break
            self._events += self._framed[eol + 2 : eol + 2 + size]
            self._framed = self._framed[end:]
            if size == 0:
                ended = True
                break
        *complete, self._events = self._events.split(b"\n\n")
        for event in complete:
            if not event.startswith(b"data: {"):
                continue
            if b'"error"' in event:
                raise StreamFailed(event.decode(errors="replace"))
            if b'"text":"' in event and b'"text":""' not in event:
                self._first = now if self._first != self._first else self._first
                self._last = now
                self._count += 1
        return ended


def _head(raw: bytes) -> tuple[int, bool, bool]:
    """(status, keep-alive, chunked) of a response head."""
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return status, headers.get("connection") != "close", headers.get("transfer-encoding") == "chunked"
