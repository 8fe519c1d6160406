"""The replicas' snapshots in one: sums, counters kept across a restart, one line per replica."""

from __future__ import annotations

import types

from metrale_core.dataparallel.snapshot import add_snapshots, combined_snapshot, counters_only
from metrale_core.engine.snapshot import EngineSnapshot


def _snap(running: int, generated: int, reasons: dict) -> EngineSnapshot:
    return EngineSnapshot(
        step=3,
        time=1.0,
        num_running=running,
        num_blocks=10,
        num_free_blocks=10 - running,
        generation_tokens_total=generated,
        requests_finished=sum(reasons.values()),
        finish_reasons=reasons,
        ttft_samples=(0.1,),
        ttft_count=1,
    )


def _slot(index: int, snap: EngineSnapshot | None, carried: EngineSnapshot | None = None):
    client = None if snap is None else types.SimpleNamespace(stats=types.SimpleNamespace(snapshot=snap))
    return types.SimpleNamespace(
        index=index,
        client=client,
        up=client is not None,
        routed=4,
        affinity_hits=1,
        restarts=0 if carried is None else 1,
        carried=carried or EngineSnapshot(),
    )


def test_sums_and_one_line_per_replica():
    a, b = _snap(2, 30, {"stop": 1}), _snap(1, 12, {"stop": 2, "length": 1})
    total = combined_snapshot([_slot(0, a), _slot(1, b)])
    assert (total.num_running, total.generation_tokens_total, total.num_blocks) == (3, 42, 20)
    assert total.finish_reasons == {"stop": 3, "length": 1} and total.ttft_samples == (0.1, 0.1)
    assert dict(total.describe_extras()) == {
        "replica 0": "up, 2 running, 0 waiting, KV 20%, 4 routed (1 by prefix), 0 restarts",
        "replica 1": "up, 1 running, 0 waiting, KV 10%, 4 routed (1 by prefix), 0 restarts",
    }


def test_a_restarted_replica_keeps_its_counters_not_its_queues():
    dead = counters_only(_snap(2, 30, {"error": 2}))
    assert dead.num_running == 0 and dead.num_blocks == 0 and dead.generation_tokens_total == 30
    total = combined_snapshot([_slot(0, None, carried=dead), _slot(1, _snap(1, 5, {}))])
    assert total.generation_tokens_total == 35 and total.num_running == 1
    assert dict(total.describe_extras())["replica 0"] == "down (restarting), 4 routed (1 by prefix), 1 restarts"
    assert add_snapshots(dead, EngineSnapshot()).finish_reasons == {"error": 2}
