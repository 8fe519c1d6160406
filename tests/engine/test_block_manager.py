"""BlockManager: ref counts, free list, chained prefix hashes, LRU eviction."""

from __future__ import annotations

import pytest

from metrale_core.engine import BlockManager, Request, Sequence
from metrale_core.sampling import SamplingParams


def seq(rid: str, prompt, order: int = 0) -> Sequence:
    return Sequence(Request(rid, prompt, SamplingParams(temperature=0.0)), order)


def test_allocate_grow_free_keeps_counts():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq("a", range(10))
    bm.allocate(a, [], 10)
    assert len(a.block_ids) == 3 and bm.num_free_blocks == 5
    assert all(bm.ref_count(b) == 1 for b in a.block_ids)
    bm.grow(a, 12)  # still fits in 3 blocks
    assert len(a.block_ids) == 3
    bm.grow(a, 13)
    assert len(a.block_ids) == 4 and bm.num_free_blocks == 4
    blocks = list(a.block_ids)
    bm.free(a)
    assert a.block_ids == [] and bm.num_free_blocks == 8
    assert all(bm.ref_count(b) == 0 for b in blocks)


def test_allocate_without_room_refuses():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = seq("a", range(9))
    assert not bm.can_allocate([], 9)
    with pytest.raises(RuntimeError, match="can_allocate"):
        bm.allocate(a, [], 9)
    assert bm.num_free_blocks == 2


def test_double_free_is_detected():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = seq("a", range(3))
    bm.allocate(a, [], 3)
    block_ids = list(a.block_ids)
    bm.free(a)
    a.block_ids = block_ids
    with pytest.raises(RuntimeError, match="freed twice"):
        bm.free(a)


def _computed(bm: BlockManager, s: Sequence, n: int) -> None:
    s.num_computed_tokens = n
    bm.cache_full_blocks(s)


def test_prefix_hit_shares_full_blocks_only():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = seq("a", list(range(1, 11)))  # 2 full blocks + 2 tokens
    bm.allocate(a, bm.match_prefix(a), 10)
    _computed(bm, a, 10)
    assert bm.num_cached_blocks() == 2
    b = seq("b", list(range(1, 9)) + [40, 41, 42])  # same first 8 tokens
    hits = bm.match_prefix(b)
    assert hits == a.block_ids[:2]
    bm.allocate(b, hits, 11)
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert [bm.ref_count(x) for x in hits] == [2, 2]
    assert b.block_ids[2] != a.block_ids[2]
    bm.free(a)
    assert [bm.ref_count(x) for x in hits] == [1, 1]


def test_hash_is_chained_over_the_whole_prefix():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(a, [], 9)
    _computed(bm, a, 9)
    # Same second block, different first block: no hit at all (positions/prefix differ).
    b = seq("b", [9, 9, 9, 9, 5, 6, 7, 8, 9])
    assert bm.match_prefix(b) == []


def test_full_hit_leaves_the_last_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = seq("a", list(range(8)))
    bm.allocate(a, [], 8)
    _computed(bm, a, 8)
    assert bm.num_cached_blocks() == 2
    b = seq("b", list(range(8)))
    hits = bm.match_prefix(b)
    assert len(hits) == 1  # the block holding the last prompt token is recomputed
    bm.allocate(b, hits, 8)
    assert b.num_computed_tokens == 4


def test_freed_cached_block_is_reused_until_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = seq("a", [1, 2, 3])
    bm.allocate(a, [], 3)
    _computed(bm, a, 3)
    cached_block = a.block_ids[0]
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks() == 1
    b = seq("b", [1, 2, 7])
    assert bm.match_prefix(b) == [cached_block]  # hit on a free block
    bm.allocate(b, [cached_block], 3)
    assert bm.ref_count(cached_block) == 1 and bm.num_free_blocks == 2
    bm.free(b)
    # Uncached free blocks are handed out before the cached one; then it is evicted.
    c = seq("c", list(range(20, 26)))
    bm.allocate(c, [], 6)
    assert cached_block not in c.block_ids and bm.num_cached_blocks() == 1
    d = seq("d", [30, 31])
    bm.allocate(d, [], 2)
    assert d.block_ids == [cached_block] and bm.num_cached_blocks() == 0
    assert bm.match_prefix(seq("e", [1, 2, 3])) == []


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    a = seq("a", [1, 2, 3])
    bm.allocate(a, [], 3)
    _computed(bm, a, 3)
    assert bm.num_cached_blocks() == 0
    assert bm.match_prefix(seq("b", [1, 2, 3])) == []
