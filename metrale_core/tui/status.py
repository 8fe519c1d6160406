"""``ServerStatus``: what the dashboard shows about the server itself (not the engine).

Owner: ``met serve`` fills one while it starts (phases, weight-load progress, model, listen
address, the engine once built) and the dashboard reads it a few times a second.  It is the
"status provider" of the dashboard; tests build one by hand around an in-process engine.

Invariants:
- Every field the dashboard reads is an immutable value replaced by one assignment (phases are
  a tuple of frozen :class:`Phase`, progress a frozen :class:`LoadProgress`), so the writer
  thread (the loader) and the reader thread (the UI) never need a lock.
- ``state`` is one of :data:`STATES`; :attr:`ServerStatus.pill` maps it to the header pill
  (LOADING / SERVING / NO MODEL / FAILED / STOPPING).
- :meth:`ServerStatus.request_stop` runs the stop callback the server registered, at most once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from attrs import define, evolve, field, frozen

__all__ = ["STATES", "LoadProgress", "Phase", "ServerStatus"]

#: Server states, in the order a healthy start goes through them.
STATES = ("loading", "serving", "no_model", "failed", "stopping")
_PILLS = {
    "loading": "LOADING",
    "serving": "SERVING",
    "no_model": "NO MODEL",
    "failed": "FAILED",
    "stopping": "STOPPING",
}


@frozen
class Phase:
    """One step of the start-up checklist."""

    name: str
    #: "pending" | "running" | "done" | "failed"
    state: str = "pending"
    started: float | None = None
    ended: float | None = None
    detail: str = ""

    def elapsed(self, now: float) -> float | None:
        if self.started is None:
            return None
        return (self.ended if self.ended is not None else now) - self.started


@frozen
class LoadProgress:
    """Weight-load progress: tensors read, bytes materialised, timing."""

    tensors_done: int = 0
    tensors_total: int = 0
    bytes_done: int = 0
    #: Size of the checkpoint on disk (0 when unknown).
    checkpoint_bytes: int = 0
    started: float | None = None
    updated: float | None = None

    @property
    def fraction(self) -> float:
        return self.tensors_done / self.tensors_total if self.tensors_total else 0.0

    def rate(self) -> float | None:
        """Bytes per second so far (None before two readings)."""
        if self.started is None or self.updated is None or self.updated <= self.started:
            return None
        return self.bytes_done / (self.updated - self.started)

    def eta(self) -> float | None:
        """Seconds left, extrapolated from the tensor fraction (None when unknown)."""
        if self.started is None or self.updated is None or not 0 < self.fraction < 1:
            return None
        spent = self.updated - self.started
        return spent * (1 - self.fraction) / self.fraction


@define
class ServerStatus:
    """The server's identity and start-up state; thread-safe by single-assignment updates."""

    name: str = "metrale"
    version: str = ""
    state: str = "loading"
    #: ``host:port`` once the HTTP server listens.
    listen: str | None = None
    model: str | None = None
    kv_dtype: str | None = None
    scheduler: str | None = None
    #: A one-line reason when ``state`` is "failed".
    error: str | None = None
    phases: tuple[Phase, ...] = ()
    load: LoadProgress = field(factory=LoadProgress)
    #: The running ``LLMEngine`` (its ``snapshots.latest`` feeds the stats tab), once built.
    engine: Any = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    started: float = field(init=False)
    ready_at: float | None = None
    _stop: Callable[[], None] | None = field(default=None, repr=False)
    _stop_lock: threading.Lock = field(factory=threading.Lock, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _poll_hooks: list = field(factory=list, repr=False)

    def __attrs_post_init__(self) -> None:
        self.started = self.clock()

    # --- reading -----------------------------------------------------------------------------
    @property
    def pill(self) -> str:
        return _PILLS.get(self.state, self.state.upper())

    @property
    def base_url(self) -> str | None:
        """``http://host:port`` of the server (0.0.0.0 / :: are dialled on loopback)."""
        if not self.listen:
            return None
        host, _, port = self.listen.rpartition(":")
        if host in ("0.0.0.0", "", "::", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{port}"

    def uptime(self) -> float:
        return self.clock() - self.started

    def add_poll_hook(self, hook: Callable[[ServerStatus], None]) -> None:
        """Run ``hook(status)`` on every dashboard poll (to pull state from the server)."""
        self._poll_hooks.append(hook)

    def poll(self) -> None:
        """Run the poll hooks (the dashboard calls this before each redraw)."""
        for hook in list(self._poll_hooks):
            hook(self)

    def snapshot(self):
        """The engine's latest ``EngineSnapshot``, or None before the engine exists."""
        engine = self.engine
        return None if engine is None else engine.snapshots.latest

    # --- start-up phases ---------------------------------------------------------------------
    def plan_phases(self, *names: str) -> None:
        """Declare the checklist (all pending)."""
        self.phases = tuple(Phase(n) for n in names)

    def _update_phase(self, name: str, **changes) -> None:
        phases = list(self.phases)
        for i, phase in enumerate(phases):
            if phase.name == name:
                phases[i] = evolve(phase, **changes)
                break
        else:
            phases.append(evolve(Phase(name), **changes))
        self.phases = tuple(phases)

    def begin_phase(self, name: str, detail: str = "") -> None:
        self._update_phase(name, state="running", started=self.clock(), detail=detail)

    def end_phase(self, name: str, *, failed: bool = False, detail: str | None = None) -> None:
        changes: dict[str, Any] = {"state": "failed" if failed else "done", "ended": self.clock()}
        if detail is not None:
            changes["detail"] = detail
        self._update_phase(name, **changes)

    @contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[None]:
        """``with status.phase("weights"): ...`` marks it running, then done (or failed)."""
        self.begin_phase(name, detail)
        try:
            yield
        except BaseException as exc:
            self.end_phase(name, failed=True, detail=f"{type(exc).__name__}: {exc}")
            raise
        self.end_phase(name)

    # --- weight load -------------------------------------------------------------------------
    def start_load(self, checkpoint_bytes: int = 0) -> None:
        now = self.clock()
        self.load = LoadProgress(checkpoint_bytes=checkpoint_bytes, started=now, updated=now)

    def tensor_loaded(self, done: int, total: int, nbytes: int) -> None:
        """``load_model(on_tensor=status.tensor_loaded)``."""
        load = self.load
        started = load.started if load.started is not None else self.clock()
        self.load = evolve(
            load,
            tensors_done=done,
            tensors_total=total,
            bytes_done=load.bytes_done + nbytes,
            started=started,
            updated=self.clock(),
        )

    # --- lifecycle ---------------------------------------------------------------------------
    def set_serving(self, listen: str | None = None) -> None:
        if listen is not None:
            self.listen = listen
        self.ready_at = self.clock()
        self.state = "serving"

    def set_failed(self, error: str) -> None:
        self.error = error
        self.state = "failed"

    @property
    def stop_requested(self) -> bool:
        return self._stopped

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Register what stops the server: called once by :meth:`request_stop`, or at once when
        a stop was already requested (the user quit while the model was loading)."""
        with self._stop_lock:
            self._stop = callback
            already = self._stopped
        if already:
            callback()

    def request_stop(self) -> None:
        """Stop the server (idempotent); the dashboard calls it when the user quits."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            if self.state in ("loading", "serving"):
                self.state = "stopping"
            callback = self._stop
        if callback is not None:
            callback()
