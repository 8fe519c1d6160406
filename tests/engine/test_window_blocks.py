"""BlockManager with attention windows: per-group tables, ``slide``, the prefix-hit rule.

And the ``KVGroups`` split of a layout (``metrale_core.model_api``): the pages and tensors the
pool allocates.
"""

from __future__ import annotations

import pytest

from metrale_core.engine import BlockManager, Request, Sequence
from metrale_core.engine.block_manager import NULL_BLOCK
from metrale_core.model_api import KVLayout, PagedKVCache
from metrale_core.sampling import SamplingParams

BS = 4
W = 6


def seq(rid: str, prompt) -> Sequence:
    return Sequence(Request(rid, list(prompt), SamplingParams(temperature=0.0)), 0)


def run_to(bm: BlockManager, s: Sequence, n: int) -> None:
    """Feed ``s`` up to ``n`` computed tokens one step at a time, as the scheduler does."""
    while s.num_computed_tokens < n:
        bm.slide(s)
        bm.grow(s, s.num_computed_tokens + 1)
        s.num_computed_tokens += 1
        bm.cache_full_blocks(s)


def fed_to(bm: BlockManager, prompt_len: int, n: int) -> Sequence:
    """Sequence ``a`` of prompt ``0 .. prompt_len - 1``, prefilled at once, then fed to ``n`` tokens."""
    s = seq("a", range(prompt_len))
    bm.allocate(s, [], prompt_len)
    s.num_computed_tokens = prompt_len
    run_to(bm, s, n)
    return s


def test_groups_of_a_gemma_like_layout():
    windows = (W, W, W, W, W, None) * 3  # 5 sliding : 1 global, 18 layers (Gemma-3-270M)
    layout = KVLayout(num_layers=18, num_kv_heads=1, head_dim=2, windows=windows)
    groups = layout.groups
    assert groups.group_size == 3 and groups.windows == (None,) + (W,) * 5
    assert groups.groups[0].layers == (5, 11, 17)
    assert layout.bytes_per_page_token() * 6 == layout.bytes_per_token()
    kv = PagedKVCache.allocate(layout, 3, BS)
    assert len(kv.k) == 18 and len({id(t) for t in kv.k}) == 3  # 3 pool tensors, aliased per group
    assert kv.k[5] is kv.k[0] and kv.k[11] is kv.k[1]  # index 0 / 1 of their groups


def test_no_windows_is_one_group_of_every_layer():
    layout = KVLayout(num_layers=4, num_kv_heads=1, head_dim=2)
    assert layout.groups.windows == (None,) and layout.groups.group_size == 4
    assert layout.bytes_per_page_token() == layout.bytes_per_token()
    kv = PagedKVCache.allocate(layout, 3, BS)
    assert len({id(t) for t in kv.k}) == 4
    with pytest.raises(ValueError, match="windows"):
        KVLayout(num_layers=2, num_kv_heads=1, head_dim=2, windows=(None,))


def test_windowed_group_keeps_only_the_window():
    bm = BlockManager(num_blocks=64, block_size=BS, windows=(None, W))
    s = fed_to(bm, 5, 40)
    full, window = bm.held_blocks(s)
    assert full == 10 and window <= -(-W // BS) + 1
    assert s.group_block_ids[0][:7] == [NULL_BLOCK] * 7
    assert bm.blocks_in_use() == (full, window)
    assert bm.num_free_blocks == 64 - full - window
    bm.free(s)
    assert bm.num_free_blocks == 64 and bm.blocks_in_use() == (0, 0)


def test_room_counts_one_block_per_group():
    bm = BlockManager(num_blocks=5, block_size=BS, windows=(None, W))
    assert not bm.can_allocate([], 9)  # 3 blocks in each of two groups
    assert bm.can_allocate([], 8)
    s = seq("a", range(8))
    bm.allocate(s, [], 8)
    assert bm.num_new_blocks(s, 9) == 2 and bm.num_free_blocks == 1
    with pytest.raises(RuntimeError, match="without room"):
        bm.grow(s, 9)


def test_prefix_hit_needs_the_window_blocks_still_cached():
    bm = BlockManager(num_blocks=64, block_size=BS, enable_prefix_caching=True, windows=(None, W))
    prompt = list(range(10, 23))  # 13 tokens: a hit covers at most 3 blocks (12 tokens)
    a = seq("a", prompt)
    bm.allocate(a, [], 13)
    a.num_computed_tokens = 13
    bm.cache_full_blocks(a)
    run_to(bm, a, 30)  # the window slid past the prompt: its window blocks were released
    bm.free(a)
    b = seq("b", prompt)
    hits = bm.match_prefix(b)
    assert len(hits) == 3
    bm.allocate(b, hits, 13)
    # the row at 12 sees 7..12: window blocks 1 and 2 come from the cache, block 0 is never read
    assert b.group_block_ids[0][0] == NULL_BLOCK and NULL_BLOCK not in b.group_block_ids[0][1:]
    assert b.num_computed_tokens == 12
    bm.free(b)


def test_prefix_hit_shortens_when_a_window_block_was_evicted():
    bm = BlockManager(num_blocks=64, block_size=BS, enable_prefix_caching=True, windows=(None, W))
    prompt = list(range(10, 23))
    a = seq("a", prompt)
    bm.allocate(a, [], 13)
    a.num_computed_tokens = 13
    bm.cache_full_blocks(a)
    window_block_2 = a.group_block_ids[0][2]
    bm.free(a)
    # evict exactly window block 2 (positions 8..11) from group 1's index
    bm._cached[1].pop(bm._blocks[window_block_2].key)
    b = seq("b", prompt)
    hits = bm.match_prefix(b)
    # 3 blocks would need window blocks 1..2; 2 blocks (next row at 8 sees 3..8) need 0..1
    assert len(hits) == 2
    bm.allocate(b, hits, 13)
    assert b.num_computed_tokens == 8 and NULL_BLOCK not in b.group_block_ids[0]


def test_truncate_and_free_skip_slid_blocks():
    bm = BlockManager(num_blocks=32, block_size=BS, windows=(None, W))
    s = fed_to(bm, 4, 20)
    bm.grow(s, 24)  # a verify chunk's room
    bm.truncate(s, 21)
    assert len(s.block_ids) == len(s.group_block_ids[0]) == 6
    bm.free(s)
    assert bm.num_free_blocks == 32


def test_all_layers_windowed_is_one_windowed_group():
    layout = KVLayout(num_layers=2, num_kv_heads=1, head_dim=2, windows=(W, W))
    assert layout.groups.windows == (W,)
    bm = BlockManager(num_blocks=16, block_size=BS, windows=layout.groups.windows)
    s = fed_to(bm, 4, 30)
    assert bm.held_blocks(s)[0] <= -(-W // BS) + 1 and s.block_ids[0] == NULL_BLOCK
    bm.free(s)
    assert bm.num_free_blocks == 16


def test_lora_adapters_never_share_window_blocks():
    """The chained keys start at the adapter's salt in every group: another adapter gets no hit."""
    from metrale_core.engine.adapter_key import ADAPTER_EXTRA

    bm = BlockManager(num_blocks=64, block_size=BS, enable_prefix_caching=True, windows=(None, W))
    prompt = list(range(10, 23))
    a = seq("a", prompt)
    a.extras[ADAPTER_EXTRA] = "sql@1"
    bm.allocate(a, [], 13)
    a.num_computed_tokens = 13
    bm.cache_full_blocks(a)
    window_blocks = list(a.group_block_ids[0][1:3])
    bm.free(a)
    assert bm.match_prefix(seq("base", prompt)) == []
    other = seq("other", prompt)
    other.extras[ADAPTER_EXTRA] = "chat@1"
    assert bm.match_prefix(other) == []
    same = seq("same", prompt)
    same.extras[ADAPTER_EXTRA] = "sql@1"
    hits = bm.match_prefix(same)
    bm.allocate(same, hits, 13)
    assert len(hits) == 3 and same.group_block_ids[0][1:3] == window_blocks
