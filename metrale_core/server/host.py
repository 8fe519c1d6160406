"""``EngineHost``: the served model's lifecycle (loading, ready, stopping) and admission control.

Owner: the app's lifespan creates one, starts :meth:`EngineHost.load` in the background and
calls :meth:`EngineHost.shutdown` at exit; every route is given it by dependency injection
(``deps``).

Invariants:
- The model loads on a worker thread after the server is listening: ``/health`` answers 503
  (``model_not_loaded``) until the ``AsyncEngine`` (or the served model's ``async_front``, e.g.
  data-parallel replicas) runs, then 200; a failed load stays 503 with the reason.
- That thread is its own and ends with the load (``offload.in_own_thread``, never a pooled
  executor thread): a live thread that has run torch ops keeps an OpenMP thread team, and with one
  alive the engine thread's CPU forward runs at half speed on a 2-core machine (see ``offload``).
- Admission is bounded: at most ``engine.max_num_seqs`` (times the data-parallel replicas)
  ``+ config.max_waiting`` engine requests are in flight; one more is a 503 with
  ``Retry-After`` before any work starts.  A request is
  counted when it is admitted (:meth:`EngineHost.admit`, for streams too, before the response
  body starts) until its :class:`Admission` is released.  A request that needs more engine
  requests than the whole capacity can never run: 400 naming the limit, not 503.
- While stopping, new requests get 503; in-flight requests get the grace period
  (:meth:`EngineHost.drain`, called before uvicorn closes connections), then their engine
  requests are aborted, so a stream ends with an error event and ``[DONE]``; the engine thread
  is joined last.
- ``/health`` never shows a load failure's message (it may hold local paths); the log has it.
- A served model whose engine can no longer run (``ServedModel.fault`` says why: a
  tensor-parallel rank was lost) keeps the server up: ``/health`` and every new request get 503
  ``engine_failed`` with that reason until the server is restarted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from attrs import define, field, frozen
from loguru import logger

from metrale_core.server.errors import APIError
from metrale_core.server.offload import in_own_thread

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = ["EngineHost", "ServedModel", "ServerConfig"]


@frozen
class ServedModel:
    """What the loader hands the server: a built engine and its tokenizer."""

    engine: Any  # LLMEngine
    tokenizer: Any  # Tokenizer
    #: The checkpoint's ``model_type`` (picks the default tool-call parser), if known.
    model_type: str | None = None
    #: Builds the engine front the routes talk to from ``engine`` (``AsyncEngine``'s interface:
    #: ``start`` / ``generate`` / ``abort`` / ``shutdown``); None: ``AsyncEngine(engine)``.  Data
    #: parallel puts a ``metrale_core.dataparallel.ReplicaPool`` here.
    async_front: Callable[[Any], Any] | None = None
    #: Why the engine can no longer run (None while it can), e.g. a tensor-parallel rank is lost.
    fault: Callable[[], str | None] | None = None


@frozen
class ServerConfig:
    """Options of one server process (the engine's own are in ``EngineConfig``)."""

    #: The name clients pass as ``model``.
    served_model_name: str
    #: Bearer key required on the API routes (None: no auth).
    api_key: str | None = field(default=None, repr=False)
    #: Largest accepted request body in bytes (413 above).
    max_body_bytes: int = 32 << 20
    #: Requests allowed to wait beyond ``max_num_seqs`` running ones (503 above).
    max_waiting: int = 256
    #: Tool-call parser name (None: by the model type, else ``hermes``).
    tool_call_parser: str | None = None
    #: Reasoning parser name (None: by the model type; ``"none"`` turns it off).
    reasoning_parser: str | None = None
    #: ``/v1/embeddings`` pooling, ``mean`` or ``last`` (None: the model's declared default).
    pooling: str | None = None
    #: Responses kept for ``previous_response_id`` / ``GET /v1/responses/{id}`` (LRU; 0: none).
    responses_store_size: int = 1024
    #: A stream's deltas are handed over at most this often, merged (``AsyncEngine``'s pacing;
    #: 0: every step).  Data-parallel replicas hand every step over.
    stream_interval_ms: float = 20.0
    #: Most calls a forced ``tool_choice: "required"`` turn may make (the grammar ends the list
    #: there): a model that repeats its call otherwise runs to the end of its context.
    max_tool_calls: int = 8
    #: Seconds in-flight requests get to finish at shutdown before they are aborted.
    shutdown_grace_s: float = 10.0
    #: Unix time the server started (``created`` of ``/v1/models``).
    created: int = field(factory=lambda: int(time.time()))


class Admission:
    """``n`` engine requests counted as in flight; :meth:`release` (idempotent) uncounts them.

    Released by ``run_jobs`` when the request ends, by the route when it fails before
    streaming, or, for a stream whose body never started (client gone first), when the
    admission is garbage-collected."""

    __slots__ = ("host", "n", "released")

    def __init__(self, host: EngineHost, n: int) -> None:
        self.host, self.n, self.released = host, n, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.host._release(self.n)

    def __del__(self) -> None:
        self.release()


@define
class EngineHost:
    """The served engine and its state; see the module docstring."""

    config: ServerConfig
    registry: Registry | None = None
    status: str = "loading"
    served: ServedModel | None = None
    async_engine: Any = None
    error: str | None = None
    in_flight: int = 0
    #: The app's ``ServerMetrics`` (set by ``create_app``).
    metrics: Any = None
    #: Engine request ids now running (aborted when the shutdown grace ends).
    running_ids: set = field(factory=set)
    _idle: asyncio.Event | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    async def load(self, loader: Callable[[], ServedModel]) -> None:
        """Run ``loader`` on a worker thread, then start the engine thread."""
        from metrale_core.engine import AsyncEngine

        started = time.monotonic()
        try:
            served = await in_own_thread(loader)
            if served.async_front is not None:
                async_engine = served.async_front(served.engine)
            else:
                async_engine = AsyncEngine(served.engine, stream_interval_s=self.config.stream_interval_ms / 1000)
            await in_own_thread(async_engine.start)  # a replica pool waits for its processes
        except Exception as exc:
            self.status, self.error = "failed", type(exc).__name__
            logger.error("model load failed: {}: {}", type(exc).__name__, exc)
            return
        if self.status == "stopping":
            async_engine.shutdown()
            return
        self.served, self.async_engine, self.status = served, async_engine, "ready"
        logger.info("model {!r} ready in {:.1f}s", self.config.served_model_name, time.monotonic() - started)

    async def shutdown(self) -> None:
        """Stop admitting, give in-flight requests the grace period, then stop the engine."""
        await self.drain()
        if self.async_engine is not None:
            await asyncio.to_thread(self.async_engine.shutdown)

    # --- per request ---------------------------------------------------------------------------
    def ready(self) -> ServedModel:
        """The served model; 503 while loading, after a failed load, or while stopping."""
        if self.status == "ready" and self.served is not None:
            why = self.served.fault() if self.served.fault is not None else None
            if why is not None:
                raise APIError(503, f"the engine cannot serve: {why}; restart the server", code="engine_failed")
            return self.served
        if self.status == "failed":
            raise APIError(
                503, f"the model failed to load ({self.error}); see the server log", code="model_load_failed"
            )
        if self.status == "stopping":
            raise APIError(503, "the server is shutting down", code="shutting_down")
        raise APIError(
            503, "the model is still loading; retry shortly", code="model_not_loaded", headers={"Retry-After": "5"}
        )

    @property
    def replicated(self) -> bool:
        """The engine front is data-parallel replicas (``metrale_core.dataparallel``)."""
        return hasattr(self.async_engine, "replica_status")

    @property
    def capacity(self) -> int:
        served = self.ready()
        replicas = self.async_engine.size if self.replicated else 1
        return served.engine.config.max_num_seqs * replicas + self.config.max_waiting

    def check_capacity(self, n: int) -> None:
        """503 with Retry-After when ``n`` more engine requests would overflow the queue; 400
        when ``n`` exceeds the whole capacity (it could never be admitted)."""
        if n > self.capacity:
            raise APIError(
                400,
                f"this request needs {n} engine requests (prompts x n), more "
                f"than this server ever admits at once ({self.capacity} = "
                f"--max-num-seqs + --max-waiting); lower n or send fewer "
                f"prompts",
                param="n",
                code="request_too_large",
            )
        if self.in_flight + n > self.capacity:
            raise APIError(
                503,
                f"the server is at capacity ({self.in_flight} requests in flight, limit {self.capacity}); retry later",
                code="queue_full",
                headers={"Retry-After": "1"},
            )

    def admit(self, n: int) -> Admission:
        """Check the capacity and count ``n`` engine requests as in flight until the returned
        :class:`Admission` is released."""
        self.check_capacity(n)
        self.in_flight += n
        self._idle_event().clear()
        return Admission(self, n)

    def _release(self, n: int) -> None:
        self.in_flight -= n
        if self.in_flight == 0:
            self._idle_event().set()

    @contextmanager
    def admitted(self, n: int) -> Iterator[None]:
        """Count ``n`` engine requests as in flight for the duration of the block."""
        admission = Admission(self, n)
        self.in_flight += n
        self._idle_event().clear()
        try:
            yield
        finally:
            admission.release()

    async def drain(self) -> None:
        """Stop admitting; wait up to the grace period for in-flight requests, then abort the
        engine requests still running (their streams end with an error event) and give their
        responses a moment to be written."""
        self.status = "stopping"
        if not self.in_flight:
            return
        logger.info(
            "shutdown: waiting up to {}s for {} in-flight request(s)", self.config.shutdown_grace_s, self.in_flight
        )
        try:
            await asyncio.wait_for(self._idle_event().wait(), self.config.shutdown_grace_s)
            return
        except asyncio.TimeoutError:
            pass
        logger.warning("shutdown: aborting {} request(s) still running", self.in_flight)
        if self.async_engine is not None:
            for request_id in list(self.running_ids):
                self.async_engine.abort(request_id)
        with suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle_event().wait(), 5.0)

    def _idle_event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            if self.in_flight == 0:
                self._idle.set()
        return self._idle
