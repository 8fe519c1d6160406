"""A lean streaming client for the serving benchmarks: POST, then time the SSE events as they come.

Owner: ``bench/bench_serve.py`` (both servers' streaming figures).  Not a test, not an API.

Why not httpx: on a 2-core machine the client shares the cores with the server it measures, and
httpx (line splitting, ``json.loads`` of every event, its own state machines) spends ~120 us of
CPU per streamed token at 16 streams, more than ``met serve``'s own event loop.  That CPU was
charged to whichever server was measured, so a server path's cost could not be told from the
client's.  This client reads each socket buffer once, undoes the chunked framing, and only looks
for the event boundaries and whether an event carries text: ~10-20 us per token.

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
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

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

    async def close(self) -> None:
        self._drop_idle()

    def _drop_idle(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    async def _stream_once(self, path: str, body: dict) -> tuple[float, float, float, int]:
        reader, writer = self._idle.pop() if self._idle else await asyncio.open_connection(self.host, self.port)
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        sent = time.perf_counter()
        writer.write(head + payload)
        try:
            status, keep_alive, chunked = _head(await reader.readuntil(b"\r\n\r\n"))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            writer.close()
            raise _Closed(str(exc)) from None
        if status != 200 or not chunked:
            writer.close()
            raise StreamFailed(f"HTTP {status} (chunked: {chunked}) from {path}")
        timing = await _read_events(reader, writer)
        if keep_alive:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return (sent, *timing)


def _head(raw: bytes) -> tuple[int, bool, bool]:
    """(status, keep-alive, chunked) of a response head."""
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return status, headers.get("connection") != "close", headers.get("transfer-encoding") == "chunked"


async def _read_events(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[float, float, int]:
    """Read a chunked SSE body to its end: (first text event, last text event, text events)."""
    framed = b""  # received, still chunk-framed
    events = b""  # de-chunked, not yet split into events
    first = last = NAN
    count = 0
    while True:
        data = await reader.read(1 << 16)
        if not data:
            writer.close()
            raise _Closed("the server closed the connection mid-response")
        now = time.perf_counter()
        framed += data
        ended = False
        while True:  # undo the chunked framing of every complete chunk
            eol = framed.find(b"\r\n")
            if eol < 0:
                break
            size = int(framed[:eol].split(b";")[0], 16)
            end = eol + 2 + size + 2
            if len(framed) < end:
                break
            events += framed[eol + 2 : eol + 2 + size]
            framed = framed[end:]
            if size == 0:
                ended = True
                break
        *complete, events = events.split(b"\n\n")
        for event in complete:
            if not event.startswith(b"data: {"):
                continue
            if b'"error"' in event:
                raise StreamFailed(event.decode(errors="replace"))
            if b'"text":"' in event and b'"text":""' not in event:
                first = now if first != first else first
                last = now
                count += 1
        if ended:
            return first, last, count
