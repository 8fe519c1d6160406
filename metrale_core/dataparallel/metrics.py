"""Data-parallel metrics: the replicas' engine reports summed, and per-replica families.

Owner: ``ReplicaPool.engine_stats`` / ``ReplicaPool.metric_families``, read by the server's
``/metrics`` collector at scrape time.

Exported per replica (labels ``model_name``, ``replica``):
- gauges ``metrale:replica_up`` (1/0), ``metrale:replica_num_requests_running``,
  ``metrale:replica_num_requests_waiting``, ``metrale:replica_kv_cache_usage_perc``,
  ``metrale:replica_requests_in_flight`` (routed by the front, not yet finished);
- counters ``metrale:replica_requests_routed_total``,
  ``metrale:replica_prefix_affinity_hits_total`` (requests routed to the holder of their
  prefix), ``metrale:replica_restarts_total``, ``metrale:replica_prefix_cache_hits_total``.

Invariants:
- A replica that is down counts as idle with no blocks in the sums; its engine counters from
  before are kept (``ReplicaSlot.carried``) so summed counters never decrease.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from metrale_core.engine.block_manager import PrefixCacheStats
from metrale_core.engine.engine import EngineStats

__all__ = ["replica_families", "summed_stats"]


def _current(slot: Any) -> Any:
    """The replica's last ``ReplicaReport`` (None while it is down)."""
    client = slot.client
    return client.stats if client is not None and client.stats is not None else None


def summed_stats(slots: Sequence[Any], engine: Any) -> tuple[EngineStats, PrefixCacheStats]:
    """All replicas' last reports as one engine's ``(EngineStats, PrefixCacheStats)``."""
    running = waiting = free = blocks = cached = slots_free = 0
    queries = hits = preemptions = 0
    for slot in slots:
        gone = slot.carried
        queries, hits = queries + gone.prefix_cache_queries, hits + gone.prefix_cache_hits
        preemptions += gone.num_preemptions
        current = _current(slot)
        if current is None:
            continue
        stats, prefix = current.stats, current.prefix
        running += stats.num_running
        waiting += stats.num_waiting
        free += stats.num_free_blocks
        blocks += stats.num_blocks
        cached += stats.num_cached_blocks
        slots_free += stats.num_free_state_slots
        preemptions += stats.num_preemptions
        queries += prefix.queries
        hits += prefix.hits
    return (
        EngineStats(
            num_running=running,
            num_waiting=waiting,
            num_free_blocks=free,
            num_blocks=blocks,
            num_cached_blocks=cached,
            num_free_state_slots=slots_free,
            num_preemptions=preemptions,
        ),
        PrefixCacheStats(queries=queries, hits=hits),
    )


def replica_families(slots: Sequence[Any], model_name: str) -> list[Metric]:
    """The per-replica families (see the module docstring)."""
    labels = ["model_name", "replica"]

    def family(kind: type, name: str, doc: str, value) -> Metric:
        fam = kind(name, doc, labels=labels)
        for slot in slots:
            fam.add_metric([model_name, str(slot.index)], float(value(slot)))
        return fam

    def engine(read) -> Any:
        def value(slot: Any) -> float:
            current = _current(slot)
            return read(current.stats, current.prefix) if current is not None else 0.0

        return value

    def usage(stats: EngineStats, _prefix: Any) -> float:
        return (stats.num_blocks - stats.num_free_blocks) / stats.num_blocks if stats.num_blocks else 0.0

    g, c = GaugeMetricFamily, CounterMetricFamily
    return [
        family(g, "metrale:replica_up", "1 while the replica serves, 0 while it is down", lambda s: s.up),
        family(
            g,
            "metrale:replica_num_requests_running",
            "Requests running on the replica",
            engine(lambda st, _p: st.num_running),
        ),
        family(
            g,
            "metrale:replica_num_requests_waiting",
            "Requests waiting on the replica",
            engine(lambda st, _p: st.num_waiting),
        ),
        family(g, "metrale:replica_kv_cache_usage_perc", "Fraction of the replica's KV blocks in use", engine(usage)),
        family(
            g,
            "metrale:replica_requests_in_flight",
            "Requests routed to the replica, not finished",
            lambda s: s.in_flight,
        ),
        family(c, "metrale:replica_requests_routed", "Requests routed to the replica", lambda s: s.routed),
        family(
            c,
            "metrale:replica_prefix_affinity_hits",
            "Requests routed to the replica because it holds their prefix",
            lambda s: s.affinity_hits,
        ),
        family(c, "metrale:replica_restarts", "Times the replica was restarted after dying", lambda s: s.restarts),
        family(
            c,
            "metrale:replica_prefix_cache_hits",
            "Prompt tokens served by the replica's prefix cache",
            lambda s: s.carried.prefix_cache_hits + engine(lambda _st, p: p.hits)(s),
        ),
    ]
