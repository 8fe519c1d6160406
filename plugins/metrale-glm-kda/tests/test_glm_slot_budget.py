"""The recurrent-state pool is sized from ``EngineConfig.recurrent_state_memory``, not only from
``max_num_seqs``: a GLM-5.3 engine whose budget holds two sequences' KDA state allocates two
slots, runs four requests (the others wait for a slot) and produces the same greedy tokens as an
engine with a slot per request; a budget below one sequence is a ``ConfigError``."""

from __future__ import annotations

import glm_harness as H
import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.errors import ConfigError
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.weights import open_weights


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("slots")
    H.save_checkpoint("hc2", path, seed=4)
    store = open_weights(path)
    return load_registry().find_model_loader(store.config).factory(store, LoadOptions())


def _run(model, budget):
    engine = LLMEngine(
        model, EngineConfig(block_size=4, num_kv_blocks=128, max_num_seqs=4, recurrent_state_memory=budget)
    )
    g = torch.Generator().manual_seed(9)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"r{i}", torch.randint(3, H.VOCAB, (5 + 3 * i,), generator=g).tolist(), params)
    out = {f"r{i}": [] for i in range(4)}
    most_running = 0
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
        most_running = max(most_running, engine.stats().num_running)
    return engine, out, most_running


def test_state_pool_sized_from_the_memory_budget(model):
    per_seq = model.info.recurrent.bytes_per_sequence
    roomy, want, _ = _run(model, 1 << 30)
    assert roomy.runner.state.num_slots == 4
    tight, got, most_running = _run(model, 2 * per_seq + per_seq // 2)
    assert tight.runner.state.num_slots == 2 and tight.scheduler.state_slots.num_slots == 2
    assert most_running == 2
    assert got == want and all(len(t) == 6 for t in got.values())
    with pytest.raises(ConfigError, match="recurrent_state_memory"):
        _run(model, per_seq - 1)
