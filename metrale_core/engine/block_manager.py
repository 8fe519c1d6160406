"""``BlockManager``: the ref-counted KV block allocator and its prefix cache.

Owner: the scheduler.  It never touches tensors: a block is an id into the runner's
``PagedKVCache``.

Invariants:
- A block is on the free list exactly when its ref count is 0; it is handed out again only from
  the free list.  ``num_free_blocks + blocks in use == num_blocks``.
- Prefix caching (when on) keys FULL, fully computed blocks by a chained hash
  ``H(parent_hash, block token ids)``, so a key names the whole token prefix up to the block's
  end: a hit reuses the K/V of exactly the same tokens at exactly the same positions.
- A freed cached block keeps its key and stays reusable by a hit until it is evicted; eviction
  takes the least recently freed block, uncached blocks first.
- A hit never covers the last token of the content being prefilled (at most
  ``(num_tokens - 1) // block_size`` blocks), so that position is always recomputed and its
  logits exist.  Shared blocks are never written: a sequence only writes positions at or after
  its ``num_computed_tokens``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Protocol

from attrs import define, field, frozen

from metrale_core.engine.adapter_key import adapter_of
from metrale_core.engine.request import Sequence

__all__ = ["BlockHolder", "BlockManager", "PrefixCacheStats"]


class BlockHolder(Protocol):
    """What growing, truncating and freeing read of a sequence (a drafter's per-request state
    provides the same two attributes)."""

    @property
    def request_id(self) -> str: ...

    block_ids: list[int]


@frozen
class PrefixCacheStats:
    """Prefix-cache counters since start, in tokens (vLLM's ``prefix_cache_queries/hits``)."""

    #: Prompt tokens looked up at admission (prefix caching on).
    queries: int
    #: Of those, tokens served from cached blocks.
    hits: int


def chain_hash(parent: bytes, token_ids: Seq[int]) -> bytes:
    """The prefix-cache key of a full block whose prefix hashes to ``parent``."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in token_ids))
    return h.digest()


def _salt(seq: Sequence) -> bytes:
    """Where a sequence's chain of block keys starts: its LoRA adapter's key (the base: empty),
    so two adapters never share KV."""
    key = adapter_of(seq)
    return b"" if key is None else b"lora\0" + key.encode()


@define
class _Block:
    block_id: int
    ref_count: int = 0
    #: Prefix-cache key while the block is registered, else None.
    key: bytes | None = None


@define
class BlockManager:
    """Ref-counted blocks, a free list (LRU for cached blocks) and the prefix-cache index."""

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = False
    _blocks: list[_Block] = field(init=False)
    #: block id -> None, in eviction order (front is taken first).
    _free: OrderedDict = field(init=False)
    #: prefix-cache key -> block id.
    _cached: dict[bytes, int] = field(init=False, factory=dict)
    #: request id -> keys of its leading full blocks, in order.
    _seq_keys: dict[str, list[bytes]] = field(init=False, factory=dict)
    _queries: int = field(init=False, default=0)
    _hits: int = field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._blocks = [_Block(i) for i in range(self.num_blocks)]
        self._free = OrderedDict((i, None) for i in range(self.num_blocks))

    # --- queries -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0 (cached ones included: they are evictable)."""
        return len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(queries=self._queries, hits=self._hits)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` positions."""
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the longest prefix of ``seq``'s content (never its last token)."""
        if not self.enable_prefix_caching:
            return []
        tokens = seq.all_token_ids()[:seq.num_prefill_tokens]
        hits: list[int] = []
        parent = _salt(seq)
        bs = self.block_size
        for i in range((len(tokens) - 1) // bs):
            parent = chain_hash(parent, tokens[i * bs:(i + 1) * bs])
            block_id = self._cached.get(parent)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_new_blocks(self, seq: BlockHolder, num_tokens: int) -> int:
        """Blocks ``seq`` must take from the free list to hold ``num_tokens`` positions."""
        return max(0, self.blocks_for(num_tokens) - len(seq.block_ids))

    def can_allocate(self, hits: Seq[int], num_tokens: int) -> bool:
        """True when a sequence with no blocks, reusing ``hits``, can hold ``num_tokens``."""
        free_hits = sum(1 for b in hits if self._blocks[b].ref_count == 0)
        needed = max(0, self.blocks_for(num_tokens) - len(hits))
        return needed + free_hits <= self.num_free_blocks

    # --- mutations ---------------------------------------------------------------------------
    def allocate(self, seq: Sequence, hits: Seq[int], num_tokens: int) -> None:
        """Give a block-less ``seq`` the ``hits`` (shared) plus fresh blocks up to ``num_tokens``.

        Sets ``seq.num_computed_tokens`` / ``num_cached_tokens`` to the tokens the hits cover.
        """
        if seq.block_ids:
            raise RuntimeError(f"{seq!r} already holds blocks")
        if not self.can_allocate(hits, num_tokens):
            raise RuntimeError(f"allocate called for {seq!r} without room; check can_allocate first")
        for block_id in hits:
            block = self._blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
        seq.block_ids = list(hits)
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self._queries += seq.num_prefill_tokens
            self._hits += seq.num_cached_tokens
            keys = [self._blocks[b].key for b in hits]  # cached blocks: every one has its key
            self._seq_keys[seq.request_id] = [k for k in keys if k is not None]
        self.grow(seq, num_tokens)

    def grow(self, seq: BlockHolder, num_tokens: int) -> None:
        """Append fresh blocks to ``seq`` until it holds ``num_tokens`` positions."""
        needed = self.num_new_blocks(seq, num_tokens)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"grow called for {seq!r} without room; check num_free_blocks first")
        for _ in range(needed):
            seq.block_ids.append(self._take_free())

    def truncate(self, seq: BlockHolder, num_tokens: int) -> None:
        """Give back ``seq``'s blocks past the first ``num_tokens`` positions (speculative
        rollback: they hold only rejected drafts, never a prefix-cache key)."""
        keep = self.blocks_for(num_tokens)
        tail, seq.block_ids = seq.block_ids[keep:], seq.block_ids[:keep]
        self._release(tail)

    def free(self, seq: BlockHolder) -> None:
        """Drop ``seq``'s references; blocks reaching 0 go to the free list (tail first)."""
        self._release(seq.block_ids)
        seq.block_ids = []
        self._seq_keys.pop(seq.request_id, None)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register ``seq``'s full, fully computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        keys = self._seq_keys.setdefault(seq.request_id, [])
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_ids))
        if len(keys) >= num_full:
            return
        bs = self.block_size
        tokens = seq.token_ids(len(keys) * bs, num_full * bs)
        parent = keys[-1] if keys else _salt(seq)
        for j, i in enumerate(range(len(keys), num_full)):
            parent = chain_hash(parent, tokens[j * bs:(j + 1) * bs])
            keys.append(parent)
            block = self._blocks[seq.block_ids[i]]
            if block.key is None and parent not in self._cached:
                block.key = parent
                self._cached[parent] = block.block_id

    def reset_prefix_cache(self) -> None:
        """Forget every cached key (blocks in use keep their contents)."""
        for block in self._blocks:
            block.key = None
        self._cached.clear()
        for keys in self._seq_keys.values():
            keys.clear()

    def _release(self, block_ids: Seq[int]) -> None:
        for block_id in reversed(block_ids):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"block {block_id} freed twice")
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.key is None:
                    self._free.move_to_end(block_id, last=False)

    def _take_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self._blocks[block_id]
        if block.key is not None:
            if self._cached.get(block.key) == block_id:
                del self._cached[block.key]
            block.key = None
        block.ref_count = 1
        return block_id
