"""The replicas' engine snapshots as one, for the terminal dashboard.

Owner: ``ReplicaPool.snapshots.latest`` (the dashboard reads it like an engine's
``engine.snapshots.latest``); ``ReplicaPool`` keeps each replica's counters from processes that
died in ``ReplicaSlot.carried`` (:func:`counters_only`).

Invariants:
- Queues, pools and counters are the sums over the replicas (counters include those of the
  processes a replica had before a restart, so totals and the dashboard's rates never go back).
- Each replica gets one line in ``extras`` (``replica 0: up, 3 running, ...``), which the
  dashboard shows as it shows plugin extras; the replicas' own plugin extras are not carried.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from attrs import evolve

from metrale_core.engine.snapshot import EngineSnapshot

__all__ = ["add_snapshots", "combined_snapshot", "counters_only", "replica_line"]

#: Point-in-time values (a replica's current state; counters_only zeroes them), then every field summed.
_GAUGES = (
    "num_running",
    "num_waiting",
    "num_prefilling",
    "num_blocks",
    "num_free_blocks",
    "num_cached_blocks",
    "num_state_slots",
    "num_free_state_slots",
)
_SUMMED = (
    "step",
    *_GAUGES,
    "num_preemptions",
    "requests_total",
    "requests_finished",
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "ttft_count",
)
_TTFT_WINDOW = 512


def add_snapshots(a: EngineSnapshot, b: EngineSnapshot) -> EngineSnapshot:
    """``a`` and ``b`` summed (latest time, merged finish reasons, TTFT samples of both)."""
    reasons = Counter(a.finish_reasons)
    reasons.update(b.finish_reasons)
    return EngineSnapshot(
        **{name: getattr(a, name) + getattr(b, name) for name in _SUMMED},
        time=max(a.time, b.time),
        finish_reasons=dict(reasons),
        ttft_samples=(a.ttft_samples + b.ttft_samples)[-_TTFT_WINDOW:],
    )


def counters_only(snap: EngineSnapshot) -> EngineSnapshot:
    """``snap`` with its queues and pools emptied (what a dead process leaves behind)."""
    zeros: dict[str, Any] = dict.fromkeys(_GAUGES, 0)
    return evolve(snap, **zeros, ttft_samples=(), extras={}, extra_formats={})


def replica_line(slot: Any) -> str:
    """``up, 3 running, 1 waiting, KV 12%, 40 routed (7 by prefix), 0 restarts``."""
    client = slot.client
    report = client.stats if slot.up and client is not None else None
    counts = f"{slot.routed} routed ({slot.affinity_hits} by prefix), {slot.restarts} restarts"
    if report is None:
        return f"down (restarting), {counts}"
    snap = report.snapshot
    kv = snap.num_used_blocks / snap.num_blocks if snap.num_blocks else 0.0
    return f"up, {snap.num_running} running, {snap.num_waiting} waiting, KV {kv:.0%}, {counts}"


def combined_snapshot(slots: Sequence[Any]) -> EngineSnapshot:
    """One snapshot for all replicas (see the module docstring)."""
    total = EngineSnapshot()
    for slot in slots:
        total = add_snapshots(total, slot.carried)
        client = slot.client
        if client is not None and client.stats is not None:
            total = add_snapshots(total, client.stats.snapshot)
    return evolve(total, extras={f"replica {slot.index}": replica_line(slot) for slot in slots})
