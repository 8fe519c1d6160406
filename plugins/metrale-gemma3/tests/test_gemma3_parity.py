"""Gemma 3 through the real engine vs transformers' ``Gemma3ForCausalLM`` (fp32, ``exact`` weights).

Paged cache (block size 4), chunked prefill (20 tokens a step), four sequences of different
lengths (all but one longer than the window of the first config), three joining while the first
is mid-prefill, then 64 batched decode steps.  Every logits row the engine computes is compared
with transformers run on the exact token history the model attended to (max abs diff <= 1e-4)
and the greedy tokens with ``generate``.  The second run squeezes the KV pool so sequences are
preempted (recomputed from position 0) and must still match.  The sliding layers run on the
core's windowed KV groups, so their blocks are freed as the window moves (pool sizes are given
per KV group).
"""

from __future__ import annotations

import gemma3_harness as H
import pytest

from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing.forward_spy import ForwardSpy
from metrale_core.testing.hf_parity import parity_case, run_staggered, worst_row_diff
from metrale_core.weights import open_weights

NEW_TOKENS = 64


@pytest.fixture(scope="module", params=sorted(H.CONFIGS))
def checkpoint(request, tmp_path_factory):
    return parity_case(H, request.param, tmp_path_factory.mktemp(request.param), NEW_TOKENS)


def _run(path, blocks_per_group, prompts):
    store = open_weights(path)
    registry = load_registry()
    spec = registry.find_model_loader(store.config)
    assert spec.name == "gemma3"
    model = spec.factory(store, LoadOptions(weight_format="exact"))
    spy = ForwardSpy(model)
    # a pool page holds one KV group's layers (the sliding layers' groups free their blocks)
    engine, outputs = run_staggered(
        spy, registry, blocks_per_group * len(model.info.kv.groups.groups), prompts, NEW_TOKENS
    )
    return engine, spy, outputs


@pytest.mark.parametrize("pool", ["roomy", "preempting"])
def test_engine_matches_transformers(checkpoint, pool):
    name, path, hf, prompts, greedy = checkpoint
    blocks = 200 if pool == "roomy" else 20  # per KV group
    engine, spy, outputs = _run(path, blocks, prompts)
    preemptions = engine.stats().num_preemptions
    if pool == "roomy":
        assert preemptions == 0
    else:
        assert preemptions >= 1, "the squeezed pool should force a preemption"
    assert len(spy.rows) >= len(prompts) * NEW_TOKENS
    worst = worst_row_diff(spy.rows, prompts, outputs, lambda ids: H.hf_logits(hf, ids))
    assert worst <= 1e-4, f"{name}/{pool}: max |logits - HF| = {worst:.3g}"
    for i, (got, want) in enumerate(zip(outputs, greedy, strict=True)):
        assert got == want, f"{name}/{pool}: r{i} greedy tokens differ from transformers generate"


def test_the_window_changes_the_logits(checkpoint):
    """The prompts are longer than the window: the same weights with no window differ."""
    name, _, hf, prompts, _ = checkpoint
    full = H.make_hf_model(name, seed=len(name))
    full.config.sliding_window = 4096
    for layer in full.model.layers:
        layer.self_attn.sliding_window = 4096
    assert (H.hf_logits(full, prompts[2]) - H.hf_logits(hf, prompts[2])).abs().max().item() > 1e-3
