"""``metrale_core.bench.stats`` on known times: percentiles, per-request latencies, a level's
figures.  Pure functions, no clock."""

from __future__ import annotations

import math

import pytest

from metrale_core.bench.stats import (
    RequestRecord,
    inter_event_gaps,
    level_figures,
    mean_sd,
    percentile,
    summary,
)


def test_percentile_interpolates_between_closest_ranks():
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 50))
    assert all(math.isnan(v) for v in summary([]).values())


def test_summary_is_in_milliseconds():
    s = summary([0.010, 0.020, 0.030])
    assert s["mean"] == pytest.approx(20.0)
    assert s["p50"] == pytest.approx(20.0)
    assert s["p90"] == pytest.approx(28.0)
    assert s["p99"] == pytest.approx(29.8)


def test_mean_sd():
    assert mean_sd([2.0, 4.0]) == (3.0, pytest.approx(math.sqrt(2)))
    assert mean_sd([5.0]) == (5.0, 0.0)


def test_gaps_between_events():
    assert inter_event_gaps([1.0, 1.5, 1.5, 2.25]) == [0.5, 0.0, 0.75]
    assert inter_event_gaps([3.0]) == []


def test_request_latencies_from_known_times():
    # sent at 10.0; events at 10.1, 10.3, 10.5 (several tokens each); body ended at 10.6
    r = RequestRecord.from_usage(10.0, [10.1, 10.3, 10.5], 10.6, {"completion_tokens": 6, "prompt_tokens": 20})
    assert r.ok and r.tokens_from == "usage"
    assert (r.output_tokens, r.prompt_tokens) == (6, 20)
    assert r.ttft == pytest.approx(0.1)
    assert r.e2e == pytest.approx(0.6)
    assert r.tpot == pytest.approx(0.5 / 5)  # (E2E - TTFT) / (tokens - 1): per token, not per event


def test_tokens_fall_back_to_events_without_usage():
    r = RequestRecord.from_usage(0.0, [0.1, 0.2], 0.3, None)
    assert (r.output_tokens, r.prompt_tokens, r.tokens_from) == (2, None, "events")
    assert math.isnan(RequestRecord.from_usage(0.0, [0.1], 0.2, None).tpot)  # one token: no TPOT


def test_level_figures_count_failures_and_rate_over_the_wall_time():
    ok = [
        RequestRecord.from_usage(0.0, [0.1, 0.2, 0.3], 0.4, {"completion_tokens": 3, "prompt_tokens": 10}),
        RequestRecord.from_usage(0.5, [0.7, 0.8, 1.0], 1.0, {"completion_tokens": 3, "prompt_tokens": 10}),
    ]
    failed = RequestRecord(0.2, done=0.3, error="StreamFailed: HTTP 500")
    fig = level_figures([*ok, failed])
    assert (fig["requests"], fig["completed"], fig["failed"]) == (3, 2, 1)
    assert fig["errors"] == ["StreamFailed: HTTP 500"]
    assert fig["duration_s"] == pytest.approx(1.0)  # first sent (0.0) -> last ended (1.0)
    assert fig["output_tokens"] == 6 and fig["prompt_tokens"] == 20
    assert fig["request_throughput"] == pytest.approx(2.0)
    assert fig["output_throughput"] == pytest.approx(6.0)
    assert fig["total_token_throughput"] == pytest.approx(26.0)
    assert fig["output_tokens_from"] == "usage"
    assert fig["events"] == 6 and fig["tokens_per_event"] == pytest.approx(1.0)
    assert fig["ttft_ms"]["mean"] == pytest.approx(150.0)  # 100 and 200 ms
    # ITL per event: 100, 100 ms (first) and 100, 200 ms (second)
    assert fig["itl_ms"]["mean"] == pytest.approx(125.0)
    assert fig["itl_ms"]["p50"] == pytest.approx(100.0)
    assert fig["e2e_ms"]["p50"] == pytest.approx(450.0)


def test_level_figures_of_only_failures():
    fig = level_figures([RequestRecord(0.0, done=0.1, error="x")])
    assert (fig["completed"], fig["failed"], fig["output_tokens"]) == (0, 1, 0)
    assert math.isnan(fig["ttft_ms"]["p50"]) and fig["prompt_tokens"] is None
