"""``AsyncEngine``: an ``LLMEngine`` on its own thread, streaming to asyncio consumers.

Owner: the HTTP server builds one at startup, calls :meth:`AsyncEngine.start` once and
:meth:`AsyncEngine.shutdown` at exit; each request handler iterates :meth:`AsyncEngine.generate`.

Invariants:
- Only the engine thread touches the ``LLMEngine``; other threads talk to it through a
  thread-safe inbox (an ``EngineRequest`` to add, checked once before it is sent; or an abort)
  and receive deltas on per-request ``asyncio.Queue``\\ s filled with
  ``loop.call_soon_threadsafe``.
- A consumer that stops (``aclose()``, a cancelled task, a broken connection) aborts its request,
  which frees its blocks.
- A consumer that falls behind the engine gets the deltas waiting for it merged into one
  (``output.merge_outputs``: tokens, text, logprobs and parsed pieces concatenated in order;
  ``steps`` counts the engine steps it spans), so a slow event loop does less work per token
  instead of more; the final delta is never merged into a later one, and an exception is raised
  in its place in the order it came.
- Paced streams (``stream_interval_s`` > 0, the server's default 20 ms): a request's first delta
  with tokens and its final delta are handed over at once; deltas in between are held on the
  engine thread and handed over merged once ``stream_interval_s`` has passed since the request's
  last hand-over (checked every step, so a held delta waits at most the interval plus one step).
  Every token still arrives in order and the time to the first token is unchanged, but the event
  loop wakes, and the responses write, once per interval instead of once per step: on a small
  machine each wake-up and write (and the client's read) takes a core, and the interpreter lock,
  from the forward.  0 hands every step's delta over.
- An exception inside a step fails the requests of that step with ``"error"``; the loop goes on.
- ``shutdown()`` aborts what is left, delivers the final deltas and joins the thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from collections.abc import Sequence as Seq
from typing import Any, overload

from loguru import logger

from metrale_core.engine.deltas import RequestOutput, coalesce
from metrale_core.engine.engine import LLMEngine
from metrale_core.engine.request import EngineRequest
from metrale_core.errors import InvalidRequest, MetraleError
from metrale_core.sampling.params import SamplingParams

__all__ = ["AsyncEngine", "EngineStopped", "engine_request", "step_or_fail"]


class EngineStopped(MetraleError):
    """The engine thread is not running (never started, or shut down)."""


class AsyncEngine:
    """Runs ``engine.step()`` in a daemon thread while requests are pending."""

    def __init__(
        self,
        engine: LLMEngine,
        idle_wait_s: float = 0.01,
        stream_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self.stream_interval_s = stream_interval_s
        self._clock = clock
        #: Paced streams: request id -> when a delta with tokens was last handed over.
        self._handed: dict[str, float] = {}
        #: Paced streams: request id -> deltas held since (in order).
        self._held: dict[str, list[RequestOutput]] = {}
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the engine thread (once)."""
        if self._thread is not None:
            raise EngineStopped("AsyncEngine.start() was already called")
        self._thread = threading.Thread(target=self._run, name="metrale-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop the loop: abort pending requests, deliver their final deltas, join the thread."""
        self._stop.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("engine thread did not stop within {}s", timeout)

    def abort(self, request_id: str) -> None:
        """Ask the engine thread to abort ``request_id`` (no-op when it is unknown or done)."""
        self._inbox.put(("abort", request_id))

    @overload
    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]: ...

    @overload
    def generate(
        self,
        request: Seq[int],
        params: SamplingParams,
        request_id: str | None = None,
        timeout_s: float | None = None,
        extras: dict | None = None,
    ) -> AsyncIterator[RequestOutput]: ...

    async def generate(
        self,
        request: EngineRequest | Seq[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
        extras: dict | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream the deltas of one request; the last one has ``finished`` True.

        ``request`` is an ``EngineRequest`` (``LLMEngine.validate_request``'s record: not
        checked again), or the prompt ids followed by the params and optionally the request id,
        ``timeout_s`` and ``extras`` (per-sequence plugin state, e.g. the ``stream_parser``),
        checked here first (:func:`engine_request`).  The record is handed to the engine
        thread, which alone touches its ``extras`` from then on.

        Raises ``InvalidRequest`` / ``PromptTooLong`` before streaming for a bad request.
        """
        if not self.is_running or self._stop.is_set():
            raise EngineStopped("the engine is not running; call AsyncEngine.start() first")
        record = engine_request(self.engine, request, params, request_id, timeout_s, extras)
        request_id = record.request_id
        stream: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if request_id in self._streams:
                raise InvalidRequest(f"request id {request_id!r} is already in use")
            self._streams[request_id] = (asyncio.get_running_loop(), stream)
        self._inbox.put(record)
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                waiting = [item]
                while not waiting[-1].finished and not stream.empty():  # a consumer behind: coalesce
                    nxt = stream.get_nowait()
                    if isinstance(nxt, BaseException):
                        raise nxt
                    waiting.append(nxt)
                item = coalesce(waiting)
                finished = item.finished
                yield item
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    # --- engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        while not self._stop.is_set():
            self._drain(block=not engine.has_unfinished())
            if self._stop.is_set() or not engine.has_unfinished():
                continue
            outputs = step_or_fail(engine)
            self._deliver(outputs)
            if not outputs and engine.scheduler.last_plan.is_empty:
                self._drain(block=True, timeout=self.idle_wait_s)
        self._close()

    def _drain(self, block: bool, timeout: float | None = None) -> None:
        try:
            item = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item) -> None:
        if item is None:
            return
        if isinstance(item, EngineRequest):
            try:
                self.engine.add_request(item)
            except Exception as exc:
                self._send([(item.request_id, exc)])
            return
        _, request_id = item  # ("abort", request_id)
        self.engine.abort(request_id)
        self._handed.pop(request_id, None)
        self._held.pop(request_id, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand one step's outputs to their consumers (paced, see the invariants); a request
        nobody listens to any more is aborted."""
        if self.stream_interval_s > 0:
            outputs = self._paced(outputs)
        unfinished = {out.request_id for out in outputs if not out.finished}
        for request_id in self._send([(out.request_id, out) for out in outputs]):
            self._handed.pop(request_id, None)
            self._held.pop(request_id, None)
            if request_id in unfinished:
                self.engine.abort(request_id)

    def _paced(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """The deltas to hand over now: this step's, merged with what each request had held,
        where it finished, has had no tokens handed over yet, or was last handed over at least
        ``stream_interval_s`` ago; plus held deltas of requests this step did not run that are
        due.  The rest is held."""
        now, interval = self._clock(), self.stream_interval_s
        ready: list[RequestOutput] = []
        for out in outputs:
            rid = out.request_id
            pending = [*self._held.pop(rid, ()), out]
            last = self._handed.get(rid)
            if out.finished or last is None or now - last >= interval:
                ready.append(coalesce(pending))
                if out.finished:
                    self._handed.pop(rid, None)
                elif any(o.new_token_ids for o in pending):
                    self._handed[rid] = now
            else:
                self._held[rid] = pending
        stepped = {out.request_id for out in outputs}
        for rid in [r for r in self._held if r not in stepped and now - self._handed[r] >= interval]:
            ready.append(coalesce(self._held.pop(rid)))
            self._handed[rid] = now
        return ready

    def _send(self, items: list[tuple[str, Any]]) -> list[str]:
        """Put each ``(request_id, item)`` on its consumer's stream with one wake-up per event
        loop (not per item); returns the ids whose consumer is gone (or whose loop is closed)."""
        with self._lock:
            targets = [(rid, item, self._streams.get(rid)) for rid, item in items]
        lost: list[str] = []
        by_loop: dict[Any, list] = {}
        for rid, item, target in targets:
            if target is None:
                lost.append(rid)
            else:
                by_loop.setdefault(target[0], []).append((rid, target[1], item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, [(stream, item) for _, stream, item in batch])
            except RuntimeError:  # the consumers' loop is closed
                lost += [rid for rid, _, _ in batch]
        return lost

    def _close(self) -> None:
        engine = self.engine
        self._drain(block=False)
        for request_id in list(engine.scheduler.seqs):
            engine.abort(request_id)
        if engine.has_unfinished():
            self._deliver(engine.step())


def engine_request(
    engine: LLMEngine,
    request: EngineRequest | Seq[int],
    params: SamplingParams | None = None,
    request_id: str | None = None,
    timeout_s: float | None = None,
    extras: dict | None = None,
) -> EngineRequest:
    """``request`` itself when it is an ``EngineRequest`` (already checked); else the prompt
    ``request`` with the rest, checked by ``engine.validate_request`` under ``request_id`` (a
    fresh id when None)."""
    if isinstance(request, EngineRequest):
        return request
    rid = request_id if request_id is not None else uuid.uuid4().hex
    return engine.validate_request(rid, request, params, timeout_s=timeout_s, extras=extras)  # type: ignore[arg-type]


def step_or_fail(engine: LLMEngine) -> list[RequestOutput]:
    """One ``engine.step()``; when it raises, the requests of that step finish with ``"error"``
    (logged) and their final deltas are returned, so a loop driving the engine survives."""
    try:
        return engine.step()
    except Exception as exc:
        logger.exception("engine step failed; failing its requests")
        return engine.fail_in_flight(f"{type(exc).__name__}: {exc}")


def _put_all(items: list) -> None:
    """On a consumer loop: put each ``(stream, item)`` handed over in one wake-up."""
    for stream, item in items:
        stream.put_nowait(item)
