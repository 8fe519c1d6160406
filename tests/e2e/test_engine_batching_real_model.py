"""Continuous batching and preemption on a real (tiny, random) Qwen3 through the whole engine.

16 requests arrive at different steps; each must produce exactly the tokens it produces alone,
greedy and with per-request seeds. With a KV pool too small for all of them at once, requests
are preempted and recomputed, and every output still equals the unconstrained run.
"""

from __future__ import annotations

import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.random_checkpoint import write_random_checkpoint
from metrale_core.weights import open_weights


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    shapes = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    write_random_checkpoint(path, tokenizer=False, vocab_size=128, **shapes)
    store = open_weights(path)
    return load_registry().find_model_loader(store.config).factory(store, LoadOptions())


def _requests(sampled: bool):
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(16):
        prompt = torch.randint(3, 128, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist()
        params = (
            SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=12, ignore_eos=True)
            if sampled
            else SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        )
        out.append((f"r{i}", prompt, params, i // 2))  # two arrive each step
    return out


def _run(model, requests, **cfg) -> tuple[dict[str, list[int]], int]:
    engine = LLMEngine(model, EngineConfig(block_size=4, **cfg))
    outs = {rid: [] for rid, *_ in requests}
    step = 0
    while step == 0 or engine.has_unfinished() or any(a >= step for *_, a in requests):
        for rid, prompt, params, arrive in requests:
            if arrive == step:
                engine.add_request(rid, prompt, params)
        for out in engine.step():
            outs[out.request_id].extend(out.new_token_ids)
            assert out.finish_reason != "error", out.error
        step += 1
    return outs, engine


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_sixteen_staggered_requests_equal_alone(model, sampled):
    requests = _requests(sampled)
    together, _ = _run(model, requests, num_kv_blocks=256, max_prefill_tokens=32)
    for rid, prompt, params, _ in requests:
        alone, _ = _run(model, [(rid, prompt, params, 0)], num_kv_blocks=256)
        assert together[rid] == alone[rid], rid


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_preemption_under_kv_pressure_changes_nothing(model, sampled):
    requests = _requests(sampled)
    roomy, _ = _run(model, requests, num_kv_blocks=256)
    tight, engine = _run(model, requests, num_kv_blocks=14)
    assert engine.stats().num_preemptions > 0, "the pool must be too small for all at once"
    assert tight == roomy
