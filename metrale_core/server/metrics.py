"""Prometheus metrics of the server (``GET /metrics``), named like vLLM's where they exist.

Owner: the server.  Request code calls :meth:`ServerMetrics.observe` with per-request timings;
the engine's queues and pools are read at scrape time through ``engine.stats()`` and the block
manager's prefix-cache counters; plugins add theirs through the ``metrale_metrics`` hook.

Exported (all labelled ``model_name``):
- gauges ``metrale:num_requests_running``, ``metrale:num_requests_waiting``,
  ``metrale:kv_cache_usage_perc`` (0..1, blocks in use / blocks);
- counters ``metrale:prefix_cache_queries_total`` / ``metrale:prefix_cache_hits_total`` (tokens),
  ``metrale:num_preemptions_total``, ``metrale:prompt_tokens_total``,
  ``metrale:generation_tokens_total``, ``metrale:request_success_total{finished_reason}``;
- histograms ``metrale:time_to_first_token_seconds``, ``metrale:inter_token_latency_seconds``,
  ``metrale:e2e_request_latency_seconds``;
- by route (the path template, e.g. ``/v1/responses/{response_id:str}``): the counter
  ``metrale:http_requests_total{route,method,status}`` and the histogram
  ``metrale:http_request_duration_seconds{route,method}`` (a stream counts until its last byte).

Under data parallel (``metrale_core.dataparallel``) the engine gauges and counters above are the
replicas' sums, and the pool adds ``metrale:replica_*`` families labelled ``replica``.

Invariants:
- One ``CollectorRegistry`` per app (several apps in one process never clash).
- A plugin metric whose name is already exported is dropped with a warning; a plugin that raises
  is logged and skipped for that scrape.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from litestar import Request, Response, get
from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = ["ServerMetrics", "metrics_route", "plugin_metric_families"]

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
)


def plugin_metric_families(registry: Registry | None, engine: Any, taken: set[str]) -> list[Metric]:
    """Call the ``metrale_metrics`` hook and normalise the answers to metric families."""
    if registry is None:
        return []
    families: list[Metric] = []
    for plugin_name, result in registry.collect_metrics(engine):
        if isinstance(result, dict):
            result = [
                GaugeMetricFamily(str(name), f"{name} (from plugin {plugin_name})", value=float(value))
                for name, value in result.items()
            ]
        for family in result:
            if family.name in taken:
                logger.warning("plugin {!r} exports metric {!r}, already exported; dropped", plugin_name, family.name)
                continue
            taken.add(family.name)
            families.append(family)
    return families


class _EngineCollector:
    """Reads the engine at scrape time (gauges and engine-side counters)."""

    def __init__(self, host: Any, model_name: str) -> None:
        self.host = host
        self.model_name = model_name

    def collect(self) -> Iterable[Metric]:
        served = self.host.served
        if served is None:
            return []
        engine = served.engine
        front = self.host.async_engine
        if hasattr(front, "engine_stats"):  # data parallel: the replicas' reports, summed
            stats, prefix = front.engine_stats()
        else:
            stats = engine.stats()
            prefix = engine.scheduler.block_manager.prefix_cache_stats()
        labels, value = ["model_name"], [self.model_name]

        def gauge(name: str, doc: str, v: float) -> Metric:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            fam.add_metric(value, v)
            return fam

        def counter(name: str, doc: str, v: float) -> Metric:
            fam = CounterMetricFamily(name, doc, labels=labels)
            fam.add_metric(value, v)
            return fam

        used = (stats.num_blocks - stats.num_free_blocks) / stats.num_blocks if stats.num_blocks else 0.0
        families = [
            gauge("metrale:num_requests_running", "Requests running on the engine", stats.num_running),
            gauge("metrale:num_requests_waiting", "Requests waiting to be scheduled", stats.num_waiting),
            gauge("metrale:kv_cache_usage_perc", "Fraction of KV blocks in use (0..1)", used),
            counter("metrale:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", prefix.queries),
            counter("metrale:prefix_cache_hits", "Prompt tokens served by the prefix cache", prefix.hits),
            counter("metrale:num_preemptions", "Sequences preempted (by recompute)", stats.num_preemptions),
        ]
        if hasattr(front, "metric_families"):  # data parallel: one series per replica
            families += front.metric_families(self.model_name)
        taken = {fam.name for fam in families} | _SERVER_NAMES
        return families + plugin_metric_families(self.host.registry, engine, taken)


_SERVER_NAMES = {
    "metrale:time_to_first_token_seconds",
    "metrale:inter_token_latency_seconds",
    "metrale:e2e_request_latency_seconds",
    "metrale:prompt_tokens",
    "metrale:generation_tokens",
    "metrale:request_success",
    "metrale:http_requests",
    "metrale:http_request_duration_seconds",
}


class ServerMetrics:
    """The request-side instruments plus the engine collector, in a registry of their own."""

    def __init__(self, host: Any, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry
        self.ttft = Histogram(
            "metrale:time_to_first_token_seconds", "Time to first token", labels, buckets=_LATENCY_BUCKETS, registry=r
        ).labels(model_name)
        self.itl = Histogram(
            "metrale:inter_token_latency_seconds",
            "Time between output tokens",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.e2e = Histogram(
            "metrale:e2e_request_latency_seconds",
            "Request latency, end to end",
            labels,
            buckets=_E2E_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.prompt_tokens = Counter("metrale:prompt_tokens", "Prompt tokens processed", labels, registry=r).labels(
            model_name
        )
        self.generation_tokens = Counter("metrale:generation_tokens", "Tokens generated", labels, registry=r).labels(
            model_name
        )
        self._success = Counter(
            "metrale:request_success",
            "Finished requests by finish reason",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self._http = Counter(
            "metrale:http_requests",
            "HTTP requests by route, method and status",
            ["model_name", "route", "method", "status"],
            registry=r,
        )
        self._http_seconds = Histogram(
            "metrale:http_request_duration_seconds",
            "HTTP request duration by route",
            ["model_name", "route", "method"],
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        r.register(_EngineCollector(host, model_name))

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """Record one answered HTTP request on ``route`` (its path template)."""
        self._http.labels(self.model_name, route, method, str(status)).inc()
        self._http_seconds.labels(self.model_name, route, method).observe(seconds)

    def finished(self, reason: str | None, prompt_tokens: int, output_tokens: int, e2e_s: float) -> None:
        """Record one finished engine request."""
        self._success.labels(self.model_name, reason or "unknown").inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        self.e2e.observe(e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@get("/metrics", include_in_schema=False, sync_to_thread=False)
def metrics_route(request: Request) -> Response:
    """Prometheus text exposition."""
    metrics: ServerMetrics = request.app.state.metrics
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
