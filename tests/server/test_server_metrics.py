"""``GET /metrics``: vLLM-style names, values that follow the requests, and the
``metrale_metrics`` hook (families and plain dicts from plugins; clashes and failures dropped)."""

from __future__ import annotations

import httpx
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from metrale_core import hookimpl


def _samples(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"|{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name")
            out[key] = sample.value
    return out


def test_metric_names_and_counts_follow_requests(server, base_url):
    before = _samples(base_url)
    for name in (
        "metrale:num_requests_running",
        "metrale:num_requests_waiting",
        "metrale:kv_cache_usage_perc",
        "metrale:prefix_cache_queries_total",
        "metrale:prefix_cache_hits_total",
        "metrale:num_preemptions_total",
        "metrale:prompt_tokens_total",
        "metrale:generation_tokens_total",
        "metrale:time_to_first_token_seconds_count",
        "metrale:inter_token_latency_seconds_count",
        "metrale:e2e_request_latency_seconds_count",
    ):
        assert name in before, name
    resp = httpx.post(
        base_url + "/v1/completions", json={"prompt": "metrics!", "max_tokens": 5, "ignore_eos": True}
    ).json()
    after = _samples(base_url)
    assert after["metrale:prompt_tokens_total"] - before["metrale:prompt_tokens_total"] == 8
    assert after["metrale:generation_tokens_total"] - before["metrale:generation_tokens_total"] == 5
    assert resp["usage"]["completion_tokens"] == 5
    assert (
        after["metrale:time_to_first_token_seconds_count"] - before["metrale:time_to_first_token_seconds_count"]
    ) == 1
    assert (
        after["metrale:inter_token_latency_seconds_count"] - before["metrale:inter_token_latency_seconds_count"]
    ) == 4
    key = "metrale:request_success_total|finished_reason=length"
    assert after[key] - before.get(key, 0) == 1
    assert after["metrale:prefix_cache_queries_total"] >= before["metrale:prefix_cache_queries_total"] + 8
    assert after["metrale:num_requests_running"] == 0 and after["metrale:kv_cache_usage_perc"] == 0


class _Exporter:
    @hookimpl
    def metrale_metrics(self, engine):
        fam = CounterMetricFamily("metrale:test_plugin_events", "events", value=engine.stats().num_blocks)
        clash = CounterMetricFamily("metrale:prompt_tokens", "clash", value=1)
        return [fam, clash]


class _DictExporter:
    @hookimpl
    def metrale_metrics(self):
        return {"metrale:test_plugin_gauge": 2.5}


class _Broken:
    @hookimpl
    def metrale_metrics(self, engine):
        raise RuntimeError("boom")


def test_hook_metrale_metrics_exports_plugin_metrics(start_server):
    from metrale_core.plugin.discovery import load_registry

    registry = load_registry()
    for plugin in (_Exporter(), _DictExporter(), _Broken()):
        registry.pm.register(plugin, name=type(plugin).__name__)
    server, host = start_server(registry=registry)
    text = httpx.get(server.url + "/metrics").text
    samples = _samples(server.url)
    assert samples["metrale:test_plugin_events_total"] == host.served.engine.stats().num_blocks
    assert samples["metrale:test_plugin_gauge"] == 2.5
    assert "clash" not in text  # the server's own metrale:prompt_tokens wins
    assert httpx.get(server.url + "/health").status_code == 200
