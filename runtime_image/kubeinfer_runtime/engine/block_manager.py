"""KV-cache blocks: reference counts, per-sequence block tables and the prefix cache.

A block that becomes full is registered under a chained hash (its parent block's hash + its token
ids), so a later request with the same prefix reuses it instead of recomputing it. Blocks nobody
references sit in a least-recently-used free queue; a cached one stays findable there until it is
taken for new tokens.
"""

from __future__ import annotations

from collections import OrderedDict

from kubeinfer_runtime.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...]] = [()] * num_blocks  # guards against hash collisions
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    def _block_tokens_of(self, seq: Sequence, index: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])

    def _block_hash_of(self, seq: Sequence, index: int) -> int:
        while len(seq.block_hashes) <= index:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[i - 1] if i else None
            seq.block_hashes.append(hash((parent, self._block_tokens_of(seq, i))))
        return seq.block_hashes[index]

    def lookup(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of `seq`, always leaving one token to compute
        (its logits give the next token). Nothing for a prompt whose every position's logits are wanted."""
        if not self.enable_prefix_caching or seq.needs_prompt_logits:
            return []
        hits: list[int] = []
        for i in range((seq.num_tokens - 1) // self.block_size):
            block = self.cached.get(self._block_hash_of(seq, i))
            if block is None or self.block_tokens[block] != self._block_tokens_of(seq, i):
                break
            hits.append(block)
        return hits

    def allocate(self, seq: Sequence, num_tokens: int, cached_blocks: list[int] | None = None) -> bool:
        """Make `seq`'s block table (after `cached_blocks`, a lookup() result) hold `num_tokens` tokens.

        Returns False, changing nothing, when there are not enough free blocks.
        """
        cached_blocks = cached_blocks or []
        num_new = -(-num_tokens // self.block_size) - len(seq.block_table) - len(cached_blocks)
        num_revived = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        if max(num_new, 0) + num_revived > len(self.free_queue):
            return False
        for block in cached_blocks:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        seq.block_table.extend(cached_blocks)
        seq.num_cached_blocks += len(cached_blocks)
        for _ in range(num_new):
            seq.block_table.append(self._take_free_block())
        return True

    def _take_free_block(self) -> int:
        block, _ = self.free_queue.popitem(last=False)
        old_hash = self.block_hash[block]
        if old_hash is not None:  # evict it from the prefix cache
            if self.cached.get(old_hash) == block:
                del self.cached[old_hash]
            self.block_hash[block] = None
            self.block_tokens[block] = ()
        self.ref_counts[block] = 1
        return block

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks of `seq` that its computed tokens have filled since the last call."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        for i in range(seq.num_cached_blocks, num_full):
            block_hash = self._block_hash_of(seq, i)
            if block_hash not in self.cached:  # else another sequence computed the same block first
                block = seq.block_table[i]
                self.cached[block_hash] = block
                self.block_hash[block] = block_hash
                self.block_tokens[block] = self._block_tokens_of(seq, i)
        seq.num_cached_blocks = max(seq.num_cached_blocks, num_full)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the tail blocks of `seq` beyond those holding its first `num_tokens` tokens (the
        slots of rejected draft tokens). Blocks registered in the prefix cache are never in the tail:
        only computed, accepted tokens fill a registered block."""
        keep = -(-num_tokens // self.block_size)
        for block in reversed(seq.block_table[keep:]):
            self._release(block)
        del seq.block_table[keep:]

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_queue[block] = None
            if self.block_hash[block] is None:  # holds nothing reusable: hand it out first
                self.free_queue.move_to_end(block, last=False)

    def free(self, seq: Sequence) -> None:
        # Tail blocks are freed first so they are evicted first: a prefix outlives its suffixes.
        for block in reversed(seq.block_table):
            self._release(block)
        seq.block_table = []
        seq.num_cached_blocks = 0
