"""GLM-5.3 through the real engine vs transformers' ``Glm5NextForConditionalGeneration``.

Paged MLA cache (block size 4), chunked prefill (20 tokens a step, so KDA runs both its chunked
form on 20-row chunks and its recurrent form on shorter remainders), four sequences of different
lengths (three longer than ``index_topk``, one longer than a KDA chunk), joining while the first
is mid-prefill, then 32 batched decode steps.  Every logits row the engine computes is compared
with transformers run on the exact token history the model attended to (max abs diff <= 1e-4,
fp32) and the greedy tokens with transformers ``generate``.  The second run squeezes the KV pool
so sequences are preempted (recomputed from position 0 with fresh KDA state) and must still
match exactly.
"""

from __future__ import annotations

import glm_harness as H
import pytest

from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.testing.forward_spy import ForwardSpy
from metrale_core.testing.hf_parity import parity_case, run_staggered, worst_row_diff
from metrale_core.weights import open_weights
from metrale_glm_kda.model import CHUNK_MIN_ROWS

NEW_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(H.CONFIGS))
def checkpoint(request, tmp_path_factory):
    return parity_case(H, request.param, tmp_path_factory.mktemp(request.param), NEW_TOKENS)


class CountingSpy(ForwardSpy):
    """``ForwardSpy`` that also counts chunks starting at position 0 (fresh KDA state)."""

    def __init__(self, model):
        super().__init__(model)
        self.fresh_starts = 0
        self.chunk_lens: set[int] = set()

    def forward(self, batch, kv, state=None):
        self.fresh_starts += int(batch.state_fresh.sum())
        self.chunk_lens.update(batch.query_lens_host)
        return super().forward(batch, kv, state)


def _run(path, num_kv_blocks, prompts):
    store = open_weights(path)
    registry = load_registry()
    spy = CountingSpy(registry.find_model_loader(store.config).factory(store, LoadOptions()))
    engine, outputs = run_staggered(spy, registry, num_kv_blocks, prompts, NEW_TOKENS)
    return engine, spy, outputs


@pytest.mark.parametrize("pool", ["roomy", "preempting"])
def test_engine_matches_transformers(checkpoint, pool):
    name, path, hf, prompts, greedy = checkpoint
    blocks = 200 if pool == "roomy" else 40
    engine, spy, outputs = _run(path, blocks, prompts)
    preemptions = engine.stats().num_preemptions
    assert max(spy.chunk_lens) >= CHUNK_MIN_ROWS and any(1 < n < CHUNK_MIN_ROWS for n in spy.chunk_lens), (
        f"both KDA prefill forms must run, chunk lengths were {sorted(spy.chunk_lens)}"
    )
    if pool == "roomy":
        assert preemptions == 0
    else:
        assert preemptions >= 1, "the squeezed pool should force a preemption"
        assert spy.fresh_starts > len(prompts), "a preempted sequence must restart fresh from position 0"
    assert len(spy.rows) >= len(prompts) * NEW_TOKENS
    worst = worst_row_diff(spy.rows, prompts, outputs, lambda ids: H.hf_logits(hf, ids))
    assert worst <= 1e-4, f"{name}/{pool}: max |logits - HF| = {worst:.3g}"
    for i, (got, want) in enumerate(zip(outputs, greedy)):
        assert got == want, f"{name}/{pool}: r{i} greedy tokens differ from transformers generate"


def test_sparse_selection_changes_the_logits(checkpoint):
    """The prompts are long enough that the DSA indexer drops tokens: a dense-attention twin of
    the same weights (``index_topk`` above the prompt length) gives different logits."""
    name, _, hf, prompts, _ = checkpoint
    dense = H.make_hf_model(name, seed=len(name), index_topk=1024)
    sparse_logits = H.hf_logits(hf, prompts[2])
    assert (H.hf_logits(dense, prompts[2]) - sparse_logits).abs().max().item() > 1e-3
