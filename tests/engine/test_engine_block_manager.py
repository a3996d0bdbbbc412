"""Block manager: reference counts, the prefix cache and its LRU eviction."""

from __future__ import annotations

from engine_helpers import make_seq

from kubeinfer_runtime.engine.block_manager import BlockManager
from kubeinfer_runtime.engine.sequence import Sequence

BS = 4


def full(manager: BlockManager, seq_tokens: list[int], index: int = 0) -> Sequence:
    """A sequence whose whole prompt is allocated, computed and registered in the prefix cache."""
    seq = make_seq(seq_tokens, index=index)
    assert manager.allocate(seq, seq.num_tokens, manager.lookup(seq))
    seq.num_computed_tokens = seq.num_tokens
    manager.cache_full_blocks(seq)
    return seq


def test_allocate_grows_block_table_and_free_returns_every_block() -> None:
    manager = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    seq = make_seq(list(range(10)))
    assert manager.allocate(seq, 10)
    assert len(seq.block_table) == 3 and manager.num_free_blocks == 5
    assert manager.allocate(seq, 12)  # still fits the third block
    assert len(seq.block_table) == 3
    assert manager.allocate(seq, 13)
    assert len(seq.block_table) == 4
    manager.free(seq)
    assert seq.block_table == [] and manager.num_free_blocks == 8
    assert manager.ref_counts == [0] * 8


def test_allocate_that_does_not_fit_changes_nothing() -> None:
    manager = BlockManager(num_blocks=3, block_size=BS, enable_prefix_caching=True)
    seq = make_seq(list(range(20)))
    assert not manager.allocate(seq, 20)
    assert seq.block_table == [] and manager.num_free_blocks == 3


def test_prefix_hit_shares_blocks_and_always_leaves_a_token_to_compute() -> None:
    manager = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    first = full(manager, list(range(12)))  # three full blocks
    second = make_seq(list(range(12)), index=1)  # the same prompt: at most two blocks may hit
    hits = manager.lookup(second)
    assert hits == first.block_table[:2]
    longer = make_seq([*range(12), 99, 98], index=2)
    assert manager.lookup(longer) == first.block_table[:3]
    assert manager.allocate(longer, longer.num_tokens, manager.lookup(longer))
    assert [manager.ref_counts[b] for b in first.block_table] == [2, 2, 2]
    diverging = make_seq([0, 1, 2, 3, 7, 7, 7, 7, 9], index=3)
    assert manager.lookup(diverging) == first.block_table[:1]


def test_no_hits_when_prefix_caching_is_off() -> None:
    manager = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    full(manager, list(range(12)))
    assert manager.lookup(make_seq(list(range(13)), index=1)) == []


def test_freed_cached_blocks_stay_findable_until_evicted_least_recently_used_first() -> None:
    manager = BlockManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    old = full(manager, [1] * 4 + [2] * 4)
    new = full(manager, [3] * 4 + [4] * 4, index=1)
    old_blocks, new_blocks = list(old.block_table), list(new.block_table)
    manager.free(old)
    manager.free(new)
    assert manager.num_free_blocks == 4
    assert manager.lookup(make_seq([1] * 4 + [2] * 4 + [0], index=2)) == old_blocks
    # Taking two blocks evicts the older sequence's, so its prefix is gone and the newer one's stays.
    taker = make_seq(list(range(100, 108)), index=3)
    assert manager.allocate(taker, 8)
    assert sorted(taker.block_table) == sorted(old_blocks)
    assert manager.lookup(make_seq([1] * 4 + [2] * 4 + [0], index=4)) == []
    assert manager.lookup(make_seq([3] * 4 + [4] * 4 + [0], index=5)) == new_blocks


def test_blocks_holding_nothing_reusable_are_handed_out_before_cached_ones() -> None:
    manager = BlockManager(num_blocks=3, block_size=BS, enable_prefix_caching=True)
    cached = full(manager, [5] * 4)
    cached_blocks = list(cached.block_table)
    partial = make_seq([6, 6], index=1)  # never fills its block, so it is never cached
    assert manager.allocate(partial, 2)
    manager.free(cached)
    manager.free(partial)
    taker = make_seq([7, 7], index=2)
    assert manager.allocate(taker, 2)
    assert taker.block_table != cached_blocks
    assert manager.lookup(make_seq([5] * 4 + [0], index=3)) == cached_blocks
