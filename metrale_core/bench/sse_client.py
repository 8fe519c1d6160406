"""A lean streaming client for the serving benchmarks: POST, then time the SSE events as they come.

Owner: ``met bench serve`` (:mod:`metrale_core.bench.serve`) and the scripts ``bench/bench_serve.py``
and ``bench/bench_serve_path.py``.  Not an API for applications.

Why not httpx: on a 2-core machine the client shares the cores with the server it measures, and
httpx (line splitting, ``json.loads`` of every event, its own state machines) spends ~120 us of
CPU per streamed token at 16 streams, more than ``met serve``'s own event loop.  That CPU was
charged to whichever server was measured, so a server path's cost could not be told from the
client's.  This client is an ``asyncio.Protocol``: each socket read is handled in
``data_received`` (no stream reader, no task wake-up per read), the chunked framing undone in
place, and it only looks for the event boundaries and whether an event carries text; the one
event that carries ``usage`` (``stream_options.include_usage``) is the only one parsed as JSON.

Invariants:
- One request per connection at a time; a connection is reused (HTTP/1.1 keep-alive) only after
  its response was read to the end, and a kept-alive connection the server closed is retried once
  on a fresh one.
- A non-200 status or an event carrying ``"error"`` raises :class:`StreamFailed` with the text.
- An event "carries text" when its completion ``text`` or its chat delta's ``content`` /
  ``reasoning_content`` is a non-empty string; ``StreamTiming.event_times`` has one entry per such
  event, the ``time.perf_counter()`` of the socket read that brought it: events coalesced into one
  read share its time.  ``done`` is the time of the read that ended the body.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SSEClient", "StreamFailed", "StreamTiming"]

NAN = float("nan")
#: JSON keys whose non-empty string value makes an event one "with text" (compact JSON, as both
#: ``met serve`` and llama-server send it; ``"content":"`` also matches ``"reasoning_content":"``).
_TEXT_KEYS = (b'"text":"', b'"content":"')


class StreamFailed(RuntimeError):
    """The server answered with an error status or an error event."""


class _Closed(ConnectionError):
    """The server closed the connection before the response ended."""


@dataclass
class StreamTiming:
    """What one streamed request gave: when it was sent, when each event with text came, when the
    body ended, and the ``usage`` object of the stream (None if the server sent none)."""

    sent: float
    event_times: list[float] = field(default_factory=list)
    done: float = NAN
    usage: dict[str, Any] | None = None

    @property
    def first(self) -> float:
        return self.event_times[0] if self.event_times else NAN

    @property
    def last(self) -> float:
        return self.event_times[-1] if self.event_times else NAN

    @property
    def events(self) -> int:
        return len(self.event_times)


class SSEClient:
    """Keep-alive connections to one ``host:port``; :meth:`stream` POSTs and times the events.

    ``headers``: extra request headers (e.g. ``{"Authorization": "Bearer KEY"}``)."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: list[_Connection] = []

    async def stream(self, path: str, body: dict) -> StreamTiming:
        """POST ``body`` (which should ask for ``"stream": true``) and time its events."""
        fresh = not self._idle
        try:
            return await self._stream_once(path, body)
        except _Closed:
            if fresh:
                raise
            self.close()
            return await self._stream_once(path, body)

    def close(self) -> None:
        """Close the idle connections."""
        while self._idle:
            self._idle.pop().close()

    async def _stream_once(self, path: str, body: dict) -> StreamTiming:
        if self._idle:
            conn = self._idle.pop()
        else:
            _, conn = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\n{self._extra}Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        timing = StreamTiming(sent=time.perf_counter())
        try:
            keep_alive = await conn.request(head + payload, timing)
        except BaseException:  # an error, or a caller's timeout mid-response: the connection is spent
            conn.close()
            raise
        if keep_alive:
            self._idle.append(conn)
        else:
            conn.close()
        return timing


def _has_text(event: bytes) -> bool:
    for key in _TEXT_KEYS:
        at = event.find(key)
        if at >= 0 and event[at + len(key) : at + len(key) + 1] != b'"':
            return True
    return False


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection read straight from ``data_received``: no stream reader, no task
    wake-up per read, the framing undone in place."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._done: asyncio.Future | None = None
        self._lost = False
        self._timing = StreamTiming(sent=NAN)
        self._head: bytes | None = b""
        self._keep_alive = True
        self._framed = self._events = b""
        #: (status, Content-Length) of an error response whose body is still coming.
        self._error: tuple[int, int | None] | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self._lost = True
        if self._done is not None and not self._done.done():
            self._done.set_exception(_Closed("the server closed the connection mid-response"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def request(self, raw: bytes, timing: StreamTiming) -> asyncio.Future:
        """Send ``raw``, filling ``timing`` as the response comes; the future gives keep-alive."""
        self._done = asyncio.get_running_loop().create_future()
        if self._lost or self.transport is None:
            self._done.set_exception(_Closed("the kept-alive connection was closed"))
            return self._done
        self._timing = timing
        self._head = b""
        self._keep_alive = True
        self._framed = self._events = b""
        self._error = None
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
                status, self._keep_alive, chunked, length = _head(self._head[:end])
                data, self._head = self._head[end + 4 :], None
                if status != 200 or not chunked:
                    self._error = (status, length)
            if self._error is not None:
                self._framed += data
                status, length = self._error
                if length is None or len(self._framed) >= length:  # the whole error body is in
                    raise StreamFailed(f"HTTP {status}: {self._framed[:300].decode(errors='replace')}")
                return
            if self._read(data):
                self._done.set_result(self._keep_alive)
        except Exception as exc:
            self._done.set_exception(exc)
            self.close()

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
            event = event.strip()
            if not event.startswith(b"data: {"):
                continue
            if b'"error"' in event:
                raise StreamFailed(event.decode(errors="replace"))
            if _has_text(event):
                self._timing.event_times.append(now)
            if b'"usage":{' in event:
                self._timing.usage = json.loads(event[6:]).get("usage")
        if ended:
            self._timing.done = now
        return ended


def _head(raw: bytes) -> tuple[int, bool, bool, int | None]:
    """(status, keep-alive, chunked, Content-Length) of a response head."""
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    length = headers.get("content-length")
    chunked = headers.get("transfer-encoding") == "chunked"
    return status, headers.get("connection") != "close", chunked, int(length) if length and length.isdigit() else None
