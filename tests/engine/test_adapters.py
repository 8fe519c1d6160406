"""The multi-LoRA seam on the engine side: the adapter bank (checks, keys, LRU slots), the
scheduler's adapter cap and the adapter-keyed prefix cache."""

from __future__ import annotations

import pytest
import torch
from attrs import define

from metrale_core.engine.adapter_key import ADAPTER_EXTRA
from metrale_core.engine.adapters import AdapterBank, AdapterWeights
from metrale_core.errors import ConfigError
from metrale_core.layers.lowrank.lora import LoRALinear, LoRAPart, LoRARows, active_rows
from metrale_core.sampling import SamplingParams

PREFIX = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


@define
class _Plan:
    chunks: list


@define
class _Chunk:
    seq: object
    num_tokens: int


@define
class _Seq:
    extras: dict


def _bank(max_loras=2, max_rank=4):
    base = lambda x: torch.zeros(x.shape[0], 6)
    base.out_features = 6
    part = LoRAPart("m.down_proj", 0, 6, 5)
    wrapper = LoRALinear(base, [part], max_loras, max_rank, torch.float32, "cpu")
    scope = lambda slots: active_rows(None if slots is None else LoRARows.from_slots(slots))
    return AdapterBank({"m.down_proj": (wrapper, part)}, max_loras, max_rank, scope), wrapper


def _weights(seed, rank=2, source="x", out=6, inp=5, module="m.down_proj"):
    gen = torch.Generator().manual_seed(seed)
    return AdapterWeights(
        source, {module: (torch.randn(rank, inp, generator=gen), torch.randn(out, rank, generator=gen), 1.0)}
    )


def test_register_checks_rank_shape_and_module_naming_the_file():
    bank, _ = _bank()
    with pytest.raises(ConfigError, match=r"/adapters/big.*rank 8.*--max-lora-rank 4"):
        bank.register("big", _weights(0, rank=8, source="/adapters/big"))
    with pytest.raises(ConfigError, match=r"/a/shape.*shape mismatch"):
        bank.register("s", _weights(0, out=7, source="/a/shape"))
    with pytest.raises(ConfigError, match=r"/a/mod.*'m.lm_head' is not a projection"):
        bank.register("m", _weights(0, module="m.lm_head", source="/a/mod"))
    assert bank.names() == []
    key = bank.register("ok", _weights(0))
    with pytest.raises(ConfigError, match="already loaded"):
        bank.register("ok", _weights(1))
    bank.unregister("ok")
    assert bank.register("ok", _weights(1)) != key  # a reload gets a new key (prefix cache)


def test_lru_keeps_at_most_max_loras_resident_and_rewrites_evicted_ones():
    bank, wrapper = _bank(max_loras=2)
    keys = [bank.register(f"a{i}", _weights(i)) for i in range(3)]
    x = torch.randn(1, 5)
    outs = {}
    for k in keys + keys:  # rotation through 3 adapters with 2 slots
        plan = _Plan([_Chunk(_Seq({ADAPTER_EXTRA: k}), 1)])
        scope = bank.scope(plan)
        assert len(bank.resident()) <= 2 and bank.resident()[-1] == k
        with scope:
            y = wrapper(x)
        if k in outs:
            assert torch.equal(y, outs[k])  # same output after eviction and reload
        outs[k] = y
    assert bank.num_slot_writes == 6
    a, b, _ = _weights(0).modules["m.down_proj"]
    torch.testing.assert_close(outs[keys[0]], (x @ a.T) @ b.T)
    # a step needing more adapters than slots is refused (the scheduler never plans one)
    plan = _Plan([_Chunk(_Seq({ADAPTER_EXTRA: k}), 1) for k in keys])
    with pytest.raises(RuntimeError, match="more than --max-loras 2"):
        bank.rows_for(plan)
    assert bank.rows_for(_Plan([_Chunk(_Seq({}), 3)])) is None


def test_unregister_keeps_weights_of_running_sequences():
    bank, _ = _bank()
    key = bank.register("a", _weights(0))
    bank.unregister("a", in_use={key})
    assert bank.key_for("a") is None
    assert bank.rows_for(_Plan([_Chunk(_Seq({ADAPTER_EXTRA: key}), 2)])) == [0, 0]
    with pytest.raises(KeyError):
        bank.unregister("a")


def test_scheduler_runs_at_most_max_adapters_at_once(make_engine, run):
    engine = make_engine(enable_prefix_caching=False)
    engine.scheduler.max_adapters = 2
    for i, key in enumerate(["x@1", "y@2", "z@3", "x@1"]):
        engine.add_request(
            f"r{i}", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=3), extras={ADAPTER_EXTRA: key}
        )
    seen = []
    while engine.has_unfinished():
        engine.step()
        running = {s.extras[ADAPTER_EXTRA] for s in engine.scheduler.running}
        assert len(running) <= 2
        seen.append(running)
    assert seen[0] == {"x@1", "y@2"}  # FCFS: z waits at the head of the queue (r3 behind it)
    assert any("z@3" in r for r in seen)  # and runs once an adapter's sequences finish


def test_prefix_cache_never_shares_blocks_across_adapters(make_engine):
    engine = make_engine()
    params = SamplingParams(temperature=0.0, max_tokens=5)
    engine.add_request("a", [*PREFIX, 1], params, extras={ADAPTER_EXTRA: "x@1"})
    engine.step()
    engine.add_request("b", [*PREFIX, 2], params, extras={ADAPTER_EXTRA: "y@2"})
    engine.add_request("c", [*PREFIX, 3], params)
    engine.add_request("d", [*PREFIX, 4], params, extras={ADAPTER_EXTRA: "x@1"})
    engine.step()
    seqs = engine.scheduler.seqs
    assert seqs["b"].num_cached_tokens == 0 and seqs["c"].num_cached_tokens == 0
    assert seqs["d"].num_cached_tokens == 8 and seqs["d"].block_ids[:2] == seqs["a"].block_ids[:2]
