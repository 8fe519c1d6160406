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
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.forward_spy import ForwardSpy
from metrale_core.testing.staggered import run_joining_mid_prefill
from metrale_core.weights import open_weights

NEW_TOKENS = 64


def _prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, H.VOCAB, (n,), generator=g).tolist() for n in (30, 9, 70, 21)]


@pytest.fixture(scope="module", params=sorted(H.CONFIGS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = H.save_checkpoint(request.param, path, seed=len(request.param))
    prompts = _prompts(seed=len(request.param))
    greedy = [H.hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    return request.param, path, hf, prompts, greedy


def _run(path, blocks_per_group, prompts):
    store = open_weights(path)
    registry = load_registry()
    spec = registry.find_model_loader(store.config)
    assert spec.name == "gemma3"
    model = spec.factory(store, LoadOptions(weight_format="exact"))
    spy = ForwardSpy(model)
    # a pool page holds one KV group's layers (the sliding layers' groups free their blocks)
    num_kv_blocks = blocks_per_group * len(model.info.kv.groups.groups)
    engine = LLMEngine(
        spy,
        EngineConfig(block_size=4, num_kv_blocks=num_kv_blocks, max_prefill_tokens=20, max_num_seqs=4),
        registry=registry,
    )
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    # r0's 30-token prompt is mid-prefill (chunks of 20) when the others join
    return engine, spy, run_joining_mid_prefill(engine, prompts, params)


def _worst_row_diff(hf, spy, prompts, outputs) -> float:
    full = [p + o for p, o in zip(prompts, outputs, strict=True)]
    ref = [H.hf_logits(hf, seq[:-1]) for seq in full]
    assert len(spy.rows) >= len(prompts) * NEW_TOKENS
    worst = 0.0
    for history, row in spy.rows:
        owners = [i for i, seq in enumerate(full) if tuple(seq[: len(history)]) == history]
        assert owners, f"the model attended to a history that is no request's prefix: {history}"
        worst = max(worst, (row - ref[owners[0]][len(history) - 1]).abs().max().item())
    return worst


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
    worst = _worst_row_diff(hf, spy, prompts, outputs)
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
