"""``EngineSnapshot``: what the engine looks like after a step, published for dashboards.

Owner: ``LLMEngine`` owns one :class:`SnapshotPublisher` (``engine.snapshots``) and calls
:meth:`SnapshotPublisher.request_added` from ``add_request`` and :meth:`SnapshotPublisher.publish`
at the end of every ``step()``.  Readers on any thread (the terminal dashboard, a metrics
endpoint) read ``engine.snapshots.latest`` whenever they like.

Invariants:
- A snapshot is immutable (frozen record, tuples, a read-only ``extras`` mapping); publishing is
  one reference assignment, so a reader never sees a half-built snapshot and never takes a lock,
  and the engine loop never waits for a reader.
- Counters only grow (totals since the engine was built); rates are the reader's job (difference
  of two snapshots over its own clock).
- ``ttft_samples`` holds the last ``ttft_window`` times to first token in seconds, oldest first,
  measured on the engine's clock from ``add_request`` to the step that emitted the first token.
- ``extras`` is what plugins publish (speculative acceptance, a B1 count, the FP8 scale source):
  :meth:`SnapshotPublisher.set_extra` for a value, :meth:`SnapshotPublisher.add_extras_provider`
  for a callable evaluated at each publish (in the engine thread; it must be cheap).  A provider
  that raises is dropped with one warning instead of breaking the step.
- Each extra carries its own presentation, declared by the plugin that publishes it
  (``label=`` / ``format=``, an :class:`ExtraFormat` in ``extra_formats``); the core knows no
  extra by name.  Publishing again without ``label`` keeps the declared one.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from attrs import define, field, frozen
from loguru import logger

__all__ = ["EngineSnapshot", "ExtraFormat", "SnapshotPublisher", "percentile"]


@frozen
class ExtraFormat:
    """How a dashboard shows one snapshot extra: ``label: format(value)``."""

    label: str
    format: Callable[[Any], str] = str


def percentile(samples: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0..100) of ``samples``; None when there are none."""
    values = sorted(samples)
    if not values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(values)))
    return values[min(rank, len(values)) - 1]


_EMPTY: Mapping[str, Any] = MappingProxyType({})


@frozen
class EngineSnapshot:
    """The engine's queues, pools and counters after one step."""

    #: Steps published so far (0 before the first step).
    step: int = 0
    #: Engine clock (seconds) when the snapshot was taken.
    time: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    #: Running sequences still prefilling (prompt or replayed history).
    num_prefilling: int = 0
    num_blocks: int = 0
    num_free_blocks: int = 0
    #: Blocks holding a prefix-cache key (in use or evictable).
    num_cached_blocks: int = 0
    #: Recurrent-state slots (0 when the model keeps no recurrent state).
    num_state_slots: int = 0
    num_free_state_slots: int = 0
    num_preemptions: int = 0
    #: Requests accepted by ``add_request`` / finished (any reason) since start.
    requests_total: int = 0
    requests_finished: int = 0
    #: finish reason -> count.
    finish_reasons: Mapping[str, int] = _EMPTY
    #: Prompt (prefill) tokens run through the model, replays after preemption included.
    prompt_tokens_total: int = 0
    #: Tokens sampled and emitted.
    generation_tokens_total: int = 0
    #: Prefix-cache lookups and hits, in prompt tokens.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    #: Last times to first token in seconds, oldest first.
    ttft_samples: tuple[float, ...] = ()
    #: Times to first token recorded since start (``len(ttft_samples)`` is capped).
    ttft_count: int = 0
    #: Plugin-published values (name -> value), read-only.
    extras: Mapping[str, Any] = _EMPTY
    #: name -> the label and formatter its plugin declared (extras without one show as
    #: ``name: str(value)``), read-only.
    extra_formats: Mapping[str, ExtraFormat] = _EMPTY

    def describe_extras(self) -> list[tuple[str, str]]:
        """``(label, text)`` for each extra, as its plugin declared it."""
        lines = []
        for name, value in self.extras.items():
            how = self.extra_formats.get(name) or ExtraFormat(name)
            lines.append((how.label, how.format(value)))
        return lines

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Hits / queries in [0, 1]; None before the first lookup (or with caching off)."""
        if self.prefix_cache_queries == 0:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    def ttft_percentile(self, q: float) -> float | None:
        return percentile(self.ttft_samples, q)


@define
class SnapshotPublisher:
    """Keeps the counters in the engine thread and swaps in a new snapshot each step."""

    #: The engine's scheduler (read, never changed).
    scheduler: Any
    #: The engine clock.
    clock: Callable[[], float]
    ttft_window: int = 512
    latest: EngineSnapshot = field(init=False)
    _step: int = field(init=False, default=0)
    _requests_total: int = field(init=False, default=0)
    _reasons: Counter = field(init=False, factory=Counter)
    _prompt_tokens: int = field(init=False, default=0)
    _generation_tokens: int = field(init=False, default=0)
    #: request id -> arrival time, until its first token (or its end).
    _arrivals: dict = field(init=False, factory=dict)
    _ttft: deque = field(init=False)
    _ttft_count: int = field(init=False, default=0)
    _ttft_tuple: tuple = field(init=False, default=())
    _extras: dict = field(init=False, factory=dict)
    _providers: dict = field(init=False, factory=dict)
    _formats: Mapping[str, ExtraFormat] = field(init=False, default=_EMPTY)

    def __attrs_post_init__(self) -> None:
        self._ttft = deque(maxlen=self.ttft_window)
        self.latest = self._build()

    # --- plugin extras -----------------------------------------------------------------------
    def set_extra(self, name: str, value: Any, *, label: str | None = None, format: Callable[[Any], str] = str) -> None:
        """Publish ``value`` under ``name`` from the next snapshot on; a dashboard shows it as
        ``label: format(value)`` (``label`` None keeps the one declared before, else ``name``)."""
        self._declare(name, label, format)
        self._extras[name] = value

    def add_extras_provider(
        self, name: str, provider: Callable[[], Any], *, label: str | None = None, format: Callable[[Any], str] = str
    ) -> None:
        """Evaluate ``provider()`` at each publish and publish its value under ``name``
        (``label`` / ``format`` as for :meth:`set_extra`)."""
        self._declare(name, label, format)
        self._providers[name] = provider

    def _declare(self, name: str, label: str | None, format: Callable[[Any], str]) -> None:
        if label is not None:
            self._formats = MappingProxyType({**self._formats, name: ExtraFormat(label, format)})

    # --- engine thread -----------------------------------------------------------------------
    def request_added(self, request_id: str, arrival_time: float) -> None:
        self._requests_total += 1
        self._arrivals[request_id] = arrival_time
        self.latest = self._build()

    def publish(self, plan: Any, outputs: Iterable[Any]) -> EngineSnapshot:
        """Account one step (``plan`` None for outputs produced outside a step) and publish."""
        if plan is not None:
            self._step += 1
            self._prompt_tokens += plan.num_prefill_tokens
        now = self.clock()
        for out in outputs:
            self._generation_tokens += len(out.new_token_ids)
            if out.new_token_ids and out.request_id in self._arrivals:
                self._ttft.append(max(0.0, now - self._arrivals.pop(out.request_id)))
                self._ttft_count += 1
                self._ttft_tuple = ()
            if out.finished:
                self._arrivals.pop(out.request_id, None)
                self._reasons[out.finish_reason or "unknown"] += 1
        if len(self._arrivals) > 2 * len(self.scheduler.seqs) + 64:  # ends we never saw
            live = self.scheduler.seqs
            self._arrivals = {k: v for k, v in self._arrivals.items() if k in live}
        self.latest = snapshot = self._build(now)
        return snapshot

    def _extras_view(self) -> Mapping[str, Any]:
        if not self._extras and not self._providers:
            return _EMPTY
        values = dict(self._extras)
        for name, provider in list(self._providers.items()):
            try:
                values[name] = provider()
            except Exception as exc:
                logger.warning("snapshot extras provider {!r} failed and is dropped: {}", name, exc)
                del self._providers[name]
        return MappingProxyType(values)

    def _build(self, now: float | None = None) -> EngineSnapshot:
        sched = self.scheduler
        bm = sched.block_manager
        slots = sched.state_slots
        cache = bm.prefix_cache_stats()
        if not self._ttft_tuple and self._ttft:
            self._ttft_tuple = tuple(self._ttft)
        return EngineSnapshot(
            step=self._step,
            time=self.clock() if now is None else now,
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            num_prefilling=sum(1 for s in sched.running if s.is_prefilling),
            num_blocks=bm.num_blocks,
            num_free_blocks=bm.num_free_blocks,
            num_cached_blocks=bm.num_cached_blocks(),
            num_state_slots=slots.num_slots if slots.enabled else 0,
            num_free_state_slots=slots.num_free,
            num_preemptions=sched.num_preemptions,
            requests_total=self._requests_total,
            requests_finished=sum(self._reasons.values()),
            finish_reasons=MappingProxyType(dict(self._reasons)),
            prompt_tokens_total=self._prompt_tokens,
            generation_tokens_total=self._generation_tokens,
            prefix_cache_queries=cache.queries,
            prefix_cache_hits=cache.hits,
            ttft_samples=self._ttft_tuple,
            ttft_count=self._ttft_count,
            extras=self._extras_view(),
            extra_formats=self._formats,
        )
