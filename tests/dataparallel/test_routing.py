"""``PrefixRouter``: least-loaded with round-robin ties, the holder of the longest recorded
prefix while within ``slack``, never a replica that is down."""

from __future__ import annotations

import pytest

from metrale_core.dataparallel import PrefixRouter, block_hashes


def test_block_hashes_chain_full_blocks_only():
    a = block_hashes(list(range(10)), 4)
    assert len(a) == 2  # the 2 trailing tokens make no block
    assert block_hashes([*list(range(8)), 99, 98], 4) == a
    b = block_hashes([7, *list(range(1, 10))], 4)
    assert b[0] != a[0] and b[1] != a[1]  # a change in block 0 changes every later hash


def test_idle_pool_alternates_and_load_wins_without_a_prefix():
    router = PrefixRouter(block_size=4)
    assert [router.route([i], {0: 0, 1: 0}).replica for i in range(4)] == [0, 1, 0, 1]
    assert router.route([5], {0: 3, 1: 1}).replica == 1


def test_next_turn_follows_its_prefix_within_slack():
    router = PrefixRouter(block_size=4, slack=2)
    turn1 = list(range(12))
    first = router.route(turn1, {0: 0, 1: 0})
    other = 1 - first.replica
    turn2 = [*turn1, 50, 51, 52, 53, 54]
    route = router.route(turn2, {first.replica: 2, other: 0})
    assert route.replica == first.replica and route.affinity and route.matched_blocks == 3
    # beyond the slack the least-loaded replica takes it (and now holds the prefix)
    route = router.route([*turn2, 60, 61, 62, 63], {first.replica: 3, other: 0})
    assert route.replica == other and not route.affinity
    assert router.route([*turn2, 70], {0: 0, 1: 0}).replica == other


def test_a_holder_that_is_down_is_ignored():
    router = PrefixRouter(block_size=4)
    prompt = list(range(8))
    holder = router.route(prompt, {0: 0, 1: 0}).replica
    other = 1 - holder
    route = router.route(prompt, {other: 5})
    assert route.replica == other and not route.affinity


def test_lru_capacity_bounds_the_record():
    router = PrefixRouter(block_size=1, capacity=3)
    router.route([1, 2, 3, 4, 5], {0: 0})
    assert len(router._holder) == 3
    with pytest.raises(ValueError):
        router.route([1], {})
