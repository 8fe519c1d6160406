"""``ReplicaPool``: N engine replicas, each its own process, behind the ``AsyncEngine`` interface.

Owner: the server's ``EngineHost`` builds one (through ``ServedModel.async_front``) for
``met serve --data-parallel-size N``; the routes use it exactly as they use an ``AsyncEngine``
(``generate`` / ``abort`` / ``shutdown``), so every route works unchanged.

Invariants:
- ``engine`` is the front's own engine: the routes read the model's facts from it (context
  length, vocabulary, tokenizer, logit processors) and validate requests with it; it is never
  stepped.  The replicas build theirs with ``factory`` in spawned processes, each with
  ``threads`` torch threads.
- Each engine request goes to one replica, chosen by ``PrefixRouter`` (load with prefix
  affinity) among the replicas that are up.  With none up, the request finishes at once with
  ``finish_reason="error"`` saying so.
- A replica that dies fails its in-flight requests (``ReplicaClient``), is marked down
  (:attr:`replicas_down`, which makes ``/health`` 503) and is restarted on a thread of its own,
  with a growing delay when restarts keep failing; the others keep serving.
- Remote replicas (the last ``remote`` slots) run on other hosts (``met replica --connect``,
  ``remote``): the pool listens at ``address`` and gives each authenticated connection the first
  free remote slot.  One whose link ends (closed, or silent for ``link_timeout_s``) is marked
  down exactly like a dead local replica, and its slot waits for a replica to connect again
  (nothing can be restarted on another host from here).
- :meth:`shutdown` stops every replica process (asking first, killing after ``timeout``); no
  replica is restarted once it began.  Replicas are daemonic processes and exit when the front's
  pipe closes, so the front dying leaves no orphans either.
- Per-replica counters (routed requests, affinity hits, restarts) and the replicas' last engine
  reports feed ``/metrics`` (:meth:`engine_stats` aggregated, :meth:`metric_families` per
  replica) and the dashboard (:attr:`snapshots`, one line per replica); a restarted replica's
  engine counters are carried over so the totals never drop.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any, overload

from attrs import define, field
from loguru import logger

from metrale_core.dataparallel.client import ReplicaClient
from metrale_core.dataparallel.replica import replica_main
from metrale_core.dataparallel.routing import PrefixRouter, Route
from metrale_core.dataparallel.snapshot import add_snapshots, combined_snapshot, counters_only
from metrale_core.engine.async_engine import EngineStopped, engine_request
from metrale_core.engine.deltas import RequestOutput
from metrale_core.engine.request import EngineRequest
from metrale_core.engine.snapshot import EngineSnapshot
from metrale_core.errors import MetraleError
from metrale_core.sampling.params import SamplingParams

__all__ = ["ReplicaFailed", "ReplicaPool", "ReplicaSlot"]


class ReplicaFailed(MetraleError):
    """A replica process could not build its engine (or died while building it)."""


@define(eq=False)
class ReplicaSlot:
    """One replica position: its current process (if up) and its counters."""

    index: int
    client: ReplicaClient | None = None
    in_flight: int = 0
    routed: int = 0
    affinity_hits: int = 0
    restarts: int = 0
    #: Engine counters of the processes this slot had before (``snapshot.counters_only``).
    carried: EngineSnapshot = field(factory=EngineSnapshot)

    @property
    def up(self) -> bool:
        return self.client is not None and self.client.serving


@define(eq=False)
class ReplicaPool:
    """See the module docstring."""

    engine: Any
    factory: Callable[[], Any]
    size: int
    threads: int = 1
    affinity_slack: int = 4
    start_timeout_s: float = 600.0
    #: How many of the ``size`` replicas are remote (the last ones), and where they connect.
    remote: int = 0
    address: tuple[str, int] | None = None
    authkey: bytes | None = field(default=None, repr=False)
    #: How long a remote replica's link may stay silent before it is lost (``--distributed-timeout``).
    link_timeout_s: float = 60.0
    slots: list[ReplicaSlot] = field(init=False)
    router: PrefixRouter = field(init=False)
    #: The last routing decisions, newest last: ``(request_id, Route)`` (for tests and logs).
    routes: list[tuple[str, Route]] = field(init=False, factory=list)
    _owner: dict[str, int] = field(init=False, factory=dict)
    _stopping: bool = field(init=False, default=False)
    _started: bool = field(init=False, default=False)
    _ctx: Any = field(init=False, factory=lambda: multiprocessing.get_context("spawn"))
    _lock: threading.Lock = field(init=False, factory=threading.Lock)
    _listener: Any = field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"data-parallel size must be >= 1, got {self.size}")
        if not 0 <= self.remote <= self.size or (self.remote and (self.address is None or not self.authkey)):
            raise ValueError("remote replicas need 0 <= remote <= size, an address and an authkey")
        self.slots = [ReplicaSlot(i) for i in range(self.size)]
        self.router = PrefixRouter(self.engine.config.block_size, self.affinity_slack)

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._started and not self._stopping

    @property
    def replicas_down(self) -> list[int]:
        """The replicas not serving now (dead, restarting)."""
        return [s.index for s in self.slots if not s.up]

    def start(self) -> None:
        """Start every replica (in parallel) and wait until all serve; raises
        :class:`ReplicaFailed` (after stopping the others) when one cannot start."""
        if self.remote:
            from metrale_core.dataparallel.remote import ReplicaListener

            assert self.address is not None and self.authkey is not None
            self._listener = ReplicaListener(self.address, self.authkey, self.link_timeout_s)
        local = [self._spawn(slot.index) for slot in self.slots[: self.size - self.remote]]
        errors = []
        for slot in self.slots:
            try:
                launched = local[slot.index] if slot.index < len(local) else self._accept(slot.index)
                slot.client = self._connect(slot.index, *launched)
            except ReplicaFailed as exc:
                errors.append(str(exc))
        if errors:
            self.shutdown(timeout=10)
            raise ReplicaFailed("; ".join(errors))
        self._started = True
        logger.info(
            "data parallel: {} replicas up (pids {}), {} torch thread(s) each",
            self.size,
            [s.client.pid for s in self.slots if s.client],
            self.threads,
        )

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop every replica process (see the invariants)."""
        with self._lock:  # no restart puts a replica in a slot after this
            self._stopping = True
            clients = [s.client for s in self.slots if s.client is not None]
        for client in clients:
            client.request_stop()
        for client in clients:
            client.join(timeout)
        if self._listener is not None:
            self._listener.close()

    def _launch(self, index: int) -> tuple[Any, Any]:
        """A new process for slot ``index``: spawned here, or (a remote slot) the next replica
        that connects, however long that takes."""
        if index < self.size - self.remote:
            return self._spawn(index)
        return self._accept(index, wait=False)

    def _accept(self, index: int, wait: bool = True) -> tuple[Any, Any]:
        """The next remote replica to connect, sent what to build: ``(link, RemoteProcess)``."""
        from metrale_core.dataparallel.remote import RemoteProcess

        deadline = time.monotonic() + self.start_timeout_s if wait else None
        link = self._listener.take(deadline, lambda: self._stopping)
        if link is None:
            why = "the server is stopping" if self._stopping else f"none connected within {self.start_timeout_s:.0f}s"
            raise ReplicaFailed(f"remote replica {index}: {why}")
        try:
            link.send(("build", index, self.factory, self.threads, self.link_timeout_s))
        except OSError as exc:
            link.close()
            raise ReplicaFailed(f"remote replica {index} at {link.peer}: {exc}") from None
        logger.info("data parallel: remote replica {} connected from {}", index, link.peer)
        return link, RemoteProcess(link)

    def _spawn(self, index: int) -> tuple[Any, Any]:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=replica_main,
            name=f"metrale-replica-{index}",
            args=(child, index, self.factory, self.threads),
            daemon=True,
        )
        proc.start()
        child.close()
        return parent, proc

    def _connect(self, index: int, conn: Any, proc: Any) -> ReplicaClient:
        """Wait for a spawned replica's ready message; its client, started.  A replica that
        fails, times out or is still starting when the pool stops is killed."""
        deadline = time.monotonic() + self.start_timeout_s
        msg: Any = None
        why = ""
        try:
            while not conn.poll(0.2):
                if self._stopping:
                    why = "the server is stopping"
                    break
                if time.monotonic() > deadline:
                    why = f"not ready within {self.start_timeout_s:.0f}s"
                    break
            else:
                msg = conn.recv()
        except (EOFError, OSError):
            msg = None
        if msg is not None and msg[0] == "ready" and getattr(proc, "pid", 0) is None:
            proc.pid = msg[1]  # a remote replica's pid is known from its ready message
        if msg is None or msg[0] != "ready":
            if msg is None and not why:
                proc.join(10)
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            conn.close()
            why = msg[1] if msg is not None else why or getattr(proc, "lost", None) or f"exit code {proc.exitcode}"
            raise ReplicaFailed(f"replica {index} failed to start: {why}")
        client = ReplicaClient(self.engine, conn, proc, index, stats=msg[2], on_exit=self._replica_exited)
        client.start()
        return client

    def _replica_exited(self, client: ReplicaClient) -> None:
        """From the client's reader thread: mark the replica down and restart it."""
        slot = self.slots[client.index]
        if slot.client is client:
            self._carry(slot, client)
            slot.client = None
        if self._stopping:
            return
        remote = slot.index >= self.size - self.remote
        next_step = "waiting for a remote replica to connect" if remote else "restarting it"
        logger.error("data parallel: {}; {}", client.describe_exit(), next_step)
        threading.Thread(target=self._restart, args=(slot,), name=f"metrale-restart-{slot.index}", daemon=True).start()

    def _restart(self, slot: ReplicaSlot) -> None:
        delay = 1.0
        while not self._stopping:
            try:
                client = self._connect(slot.index, *self._launch(slot.index))
            except ReplicaFailed as exc:
                logger.error("data parallel: {}; retrying in {:.0f}s", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            with self._lock:
                if not self._stopping:
                    slot.restarts += 1
                    slot.client = client
            if slot.client is not client:  # the pool began stopping meanwhile
                client.shutdown(10)
                return
            where = getattr(client.process, "where", f"pid {client.pid}")
            logger.info("data parallel: replica {} is back ({})", slot.index, where)
            return

    @staticmethod
    def _carry(slot: ReplicaSlot, client: ReplicaClient) -> None:
        if client.stats is None:
            return
        slot.carried = add_snapshots(slot.carried, counters_only(client.stats.snapshot))

    # --- requests ----------------------------------------------------------------------------
    def abort(self, request_id: str) -> None:
        """Abort ``request_id`` on the replica serving it (no-op when unknown or done)."""
        index = self._owner.get(request_id)
        client = self.slots[index].client if index is not None else None
        if client is not None:
            client.abort(request_id)

    @overload
    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]: ...

    @overload
    def generate(
        self,
        request: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        timeout_s: float | None = None,
        extras: dict | None = None,
    ) -> AsyncIterator[RequestOutput]: ...

    async def generate(
        self,
        request: EngineRequest | Sequence[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
        extras: dict | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """``AsyncEngine.generate`` on the replica :attr:`router` picks: the ``EngineRequest``
        (or the request checked here, by the front's engine) goes to it as it is."""
        if isinstance(request, EngineRequest):
            request_id = request.request_id
        request_id = request_id if request_id is not None else uuid.uuid4().hex
        up = {s.index: s.in_flight for s in self.slots if s.up}
        if not up or self._stopping:
            why = "the server is shutting down" if self._stopping else "no data-parallel replica is up (restarting)"
            yield RequestOutput(request_id, finished=True, finish_reason="error", error=why)
            return
        record = engine_request(self.engine, request, params, request_id, timeout_s, extras)
        route = self.router.route(record.prompt_ids, up)
        slot = self.slots[route.replica]
        client = slot.client
        assert client is not None
        slot.routed += 1
        slot.affinity_hits += route.affinity
        self.routes = [*self.routes[-255:], (request_id, route)]
        slot.in_flight += 1
        self._owner[request_id] = slot.index
        try:
            replies: Any = client.generate(record)
            async with aclosing(replies) as stream:
                async for out in stream:
                    yield out
        except EngineStopped:  # it died between the routing and the request
            yield client.failure(request_id)
        finally:
            slot.in_flight -= 1
            self._owner.pop(request_id, None)

    # --- metrics -----------------------------------------------------------------------------
    def engine_stats(self) -> tuple[Any, Any]:
        """The replicas' last reports summed: ``(EngineStats, PrefixCacheStats)``."""
        from metrale_core.dataparallel.metrics import summed_stats

        return summed_stats(self.slots, self.engine)

    def metric_families(self, model_name: str) -> list:
        """Per-replica metric families (label ``replica``)."""
        from metrale_core.dataparallel.metrics import replica_families

        return replica_families(self.slots, model_name)

    @property
    def snapshots(self) -> Any:
        """Like ``engine.snapshots``: ``.latest`` is all replicas' snapshot in one (the
        dashboard reads it)."""
        return _Snapshots(self)

    def replica_status(self) -> dict[str, str]:
        """``{"0": "up", "1": "down"}`` for ``/health``."""
        return {str(s.index): "up" if s.up else "down" for s in self.slots}


class _Snapshots:
    """``ReplicaPool.snapshots``."""

    def __init__(self, pool: ReplicaPool) -> None:
        self.pool = pool

    @property
    def latest(self) -> EngineSnapshot:
        return combined_snapshot(self.pool.slots)
