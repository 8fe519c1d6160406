"""Gemma 3's sliding layers keep only their window's KV blocks (the core's KV groups).

A small random Gemma 3 (``window6-softcap``: window W=6, one global layer, three sliding ones) in
the real engine with blocks of B=4 tokens decodes well past the window: after every step each
sliding group holds at most ``ceil(W / B) + 1`` blocks of the sequence while the global group
holds the whole context; once the request finishes every block is free again.
"""

from __future__ import annotations

import gemma3_harness as H
import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.model_api import ForwardBatch, PagedKVCache
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.weights import open_weights

BS = 4
NAME = "window6-softcap"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp(NAME)
    H.save_checkpoint(NAME, path)
    return path


def _load(path):
    registry = load_registry()
    store = open_weights(path)
    return registry, registry.find_model_loader(store.config).factory(store, LoadOptions(weight_format="exact"))


def test_sliding_groups_hold_only_the_window(checkpoint):
    window = H.CONFIGS[NAME]["sliding_window"]
    registry, model = _load(checkpoint)
    windows = model.info.kv.groups.windows
    assert windows[0] is None and set(windows[1:]) == {window}
    engine = LLMEngine(model, EngineConfig(block_size=BS, num_kv_blocks=256, max_prefill_tokens=8), registry=registry)
    bm = engine.scheduler.block_manager
    prompt = list(range(3, 23))  # 20 tokens, prefilled in chunks of 8
    engine.add_request("r0", prompt, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    seq = engine.scheduler.seqs["r0"]
    limit = -(-window // BS) + 1
    produced = 0
    while engine.has_unfinished():
        produced += sum(len(out.new_token_ids) for out in engine.step())
        if seq.is_finished or seq.is_prefilling:
            continue
        full, *sliding = bm.held_blocks(seq)
        assert full == -(-seq.num_computed_tokens // BS), (seq.num_computed_tokens, full)
        assert all(held <= limit for held in sliding), (seq.num_computed_tokens, sliding)
    assert produced == 40 and seq.num_computed_tokens >= 20 + 39 > 8 * window
    assert bm.num_free_blocks == bm.num_blocks and bm.blocks_in_use() == (0,) * len(windows)


def test_a_grouped_cache_needs_the_group_tables(checkpoint):
    """Layers of different KV groups share pool tensors: a batch without the groups' tables
    would write them over each other, so the model refuses it."""
    _, model = _load(checkpoint)
    kv = PagedKVCache.allocate(model.info.kv, 2, BS)
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)
    batch = ForwardBatch(
        input_ids=t([5, 6]),
        positions=t([0, 1]),
        query_start=t([0, 2]),
        context_lens=t([2]),
        block_tables=t([[0]]),
        slot_mapping=t([0, 1]),
        logits_rows=t([1]),
        state_slots=t([-1]),
        state_fresh=torch.tensor([True]),
        query_lens_host=(2,),
        context_lens_host=(2,),
        block_size=BS,
    )
    with pytest.raises(ValueError, match="block tables"):
        model.forward(batch, kv)
