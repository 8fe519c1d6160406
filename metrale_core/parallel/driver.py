"""Rank 0 of a tensor-parallel job: the control channel and the model the engine drives.

Owner: ``metrale_core.parallel.launch`` builds one :class:`Driver` and one :class:`DriverModel`
per job; the engine's ``ModelRunner`` calls the model like any ``CausalLM``.

Invariants:
- Every ``forward`` / ``forward_with_hidden`` broadcasts ``(method, batch, kv geometry)`` to the
  workers before rank 0 runs its own shard, so all ranks enter the same collectives in the same
  order; the batch travels on the host (each worker moves it to its device).
- Steps and heartbeats never interleave: a step's broadcast and rank 0's forward run under one
  lock, and the heartbeat (a ``ping`` broadcast and a barrier on the control group, sent when no
  step was sent for a quarter of the timeout, from :meth:`Driver.start_heartbeat` on) takes the
  same lock.  So a worker always hears from rank 0 within the timeout while rank 0 lives, and
  rank 0 notices a silent rank within about the timeout even while idle.
- A failure of the job (a collective raised or timed out, or the executor saw a worker exit) is
  final: the first reason is kept (naming the rank and host when rank 0 knows them), every
  later forward raises :class:`WorkerLost` at once (never a hang), the ``on_failure`` callbacks
  run once, and the job is closed on a thread of its own (the executor reaps its workers; the
  ``env`` executor's remote workers exit on their own when their collectives time out).  The
  server stays up and says why it cannot serve.
- :meth:`Driver.close` is idempotent: it tells live workers to stop, leaves the group and has the
  executor reap its processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from attrs import evolve, fields
from loguru import logger

from metrale_core.errors import ConfigError, MetraleError
from metrale_core.model_api import ForwardBatch, PagedKVCache

__all__ = ["Driver", "DriverModel", "WorkerLost", "batch_to"]


class WorkerLost(MetraleError):
    """A tensor-parallel rank is gone; the job cannot run another step."""


def batch_to(batch: ForwardBatch, device: torch.device | str) -> ForwardBatch:
    """``batch`` with every tensor on ``device``."""
    moved: dict[str, Any] = {}
    for f in fields(ForwardBatch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor):
            moved[f.name] = value.to(device)
        elif isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):  # per KV group
            moved[f.name] = tuple(t.to(device) for t in value)
    return evolve(batch, **moved)


class Driver:
    """Rank 0's end of the control group, plus the executor that owns the other ranks."""

    def __init__(
        self,
        executor: Any,
        control: Any,
        world: int,
        tp: Any = None,
        *,
        setup: Any = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.executor = executor
        self.control = control
        #: The setup group (load statuses; waits as long as the slowest rank loads).
        self.setup = setup
        self.world = world
        #: Rank 0's ``TensorParallel`` (the forward's group).
        self.tp = tp
        #: How long a collective of the running job waits (``--distributed-timeout``).
        self.timeout_s = timeout_s
        #: Where each worker rank runs (``"198.18.0.2, pid 123"``), learnt at load.
        self.peers: dict[int, str] = {}
        #: Why the job failed (None while it is healthy).
        self.failed: str | None = None
        self.on_failure: list[Callable[[str], None]] = []
        #: Seconds spent broadcasting steps (a counter for ``bench/bench_parallel.py``).
        self.broadcast_s = 0.0
        #: Held while a step (broadcast + rank 0's forward) or a heartbeat runs.
        self.step_lock = threading.Lock()
        self._last_send = time.monotonic()
        self._lock = threading.Lock()
        self._closed = False
        self._watch = threading.Thread(target=self._watch_workers, name="metrale-tp-watch", daemon=True)
        self._watch.start()

    def send(self, message: Any) -> None:
        """Broadcast ``message`` (any picklable object) to every worker."""
        start = time.perf_counter()
        dist.broadcast_object_list([message], src=0, group=self.control)
        self._last_send = time.monotonic()
        self.broadcast_s += time.perf_counter() - start

    def start_heartbeat(self) -> None:
        """Once the workers serve steps: ping them whenever the job idles (see the invariants)."""
        threading.Thread(target=self._heartbeat, name="metrale-tp-heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        interval = max(0.1, self.timeout_s / 4)
        while True:
            time.sleep(interval)
            with self.step_lock:
                if self._closed or self.failed is not None:
                    return
                if time.monotonic() - self._last_send < interval:
                    continue
                try:
                    self.send(("ping",))
                    dist.barrier(group=self.control)
                except RuntimeError as exc:
                    self.fail(self.explain(exc))
                    return

    def check(self) -> None:
        if self.failed is not None:
            raise WorkerLost(f"tensor-parallel job failed: {self.failed}")
        if self._closed:
            raise WorkerLost("tensor-parallel job is shut down")

    def fail(self, reason: str) -> str:
        """Mark the job failed (the first reason wins) and run the callbacks once."""
        with self._lock:
            first = self.failed is None and not self._closed
            if self.failed is None:
                self.failed = reason
        if first:
            logger.error("tensor parallel: {}", reason)
            for callback in self.on_failure:
                try:
                    callback(reason)
                except Exception:
                    logger.exception("tensor-parallel failure callback raised")
            threading.Thread(target=self.close, args=(0.0,), name="metrale-tp-reap", daemon=True).start()
        return self.failed or reason

    def explain(self, exc: BaseException, wait_s: float = 2.0) -> str:
        """Why a collective raised: the executor's word on a dead rank when it has one within
        ``wait_s`` (a process exit is seen a moment after its sockets close), else the error."""
        deadline = time.monotonic() + wait_s
        while True:
            reason = self.executor.poll()
            if reason is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        first_line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        if reason is not None:
            return reason
        ranks = ", ".join(f"rank {r} ({where})" for r, where in sorted(self.peers.items())) or "a worker rank"
        whom = ranks if self.world == 2 else f"one of {ranks}"
        return (
            f"lost tensor-parallel {whom}: a collective failed or got no answer within "
            f"{self.timeout_s:g}s (--distributed-timeout): its host or link is down, or it is stuck ({first_line})"
        )

    def _watch_workers(self) -> None:
        while not self._closed:
            reason = self.executor.poll()
            if reason is not None and not self._closed:
                self.fail(reason)
                return
            time.sleep(0.2)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers (a ``stop`` message while the job is healthy), leave, reap."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            healthy = self.failed is None
        if healthy:
            locked = self.step_lock.acquire(timeout=self.timeout_s)  # no heartbeat in between
            try:
                dist.broadcast_object_list([("stop",)], src=0, group=self.control)
            except Exception as exc:
                logger.warning("tensor parallel: could not tell the workers to stop: {}", exc)
            finally:
                if locked:
                    self.step_lock.release()
        self.executor.shutdown(timeout)
        from metrale_core.parallel.distributed import leave

        try:
            leave()
        except Exception as exc:
            logger.debug("tensor parallel: leaving the group: {}", exc)


class DriverModel:
    """Rank 0's shard of the model, wrapped so that each forward runs on every rank."""

    def __init__(self, model: Any, driver: Driver) -> None:
        self.model = model
        self.driver = driver
        self.info = model.info

    def __getattr__(self, attr: str) -> Any:  # device, dims, weights, weight_store, ...
        if attr == "model":
            raise AttributeError(attr)
        return getattr(self.model, attr)

    def __repr__(self) -> str:
        return f"DriverModel(tp={self.driver.world}, {self.model!r})"

    def make_state_pool(self, num_slots: int) -> Any:
        return self.model.make_state_pool(num_slots)

    def forward(self, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None = None) -> torch.Tensor:
        return self._run("forward", batch, kv, state)

    def forward_with_hidden(
        self, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._run("forward_with_hidden", batch, kv, state)

    def close(self) -> None:
        self.driver.close()

    def _run(self, method: str, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None) -> Any:
        self.driver.check()
        geometry = None
        if kv is not None:
            if not kv.plain:
                raise ConfigError(
                    f"tensor parallelism keeps plain KV storage; the {kv.codec.name!r} KV "
                    f"codec is not supported with it"
                )
            geometry = (kv.num_blocks, kv.block_size, kv.k[0].dtype if kv.k else None)
        try:
            with self.driver.step_lock:
                self.driver.check()
                self.driver.send((method, batch_to(batch, "cpu"), geometry))
                return getattr(self.model, method)(batch, kv, state)
        except WorkerLost:
            raise
        except RuntimeError as exc:  # a collective failed: a rank is gone or stuck
            reason = self.driver.fail(self.driver.explain(exc))
            raise WorkerLost(f"tensor-parallel job failed: {reason}") from exc
