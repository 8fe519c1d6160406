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

KV groups (attention windows, ``metrale_core.model_api.KVGroups``).  ``windows`` names each
group's window (one full group, ``(None,)``, without windows: then everything below is exactly
the single-table manager).  Every group has its own table per sequence (``seq.block_ids`` for
group 0, ``seq.group_block_ids[g - 1]``), all of the same length, over the one shared free list.
- Growing to ``n`` tokens takes ``blocks_for(n) - len(table)`` fresh blocks in EVERY group, so a
  sequence's room is ``(len(table) + num_free_blocks // num_groups) * block_size`` tokens.
- :meth:`slide` (the scheduler calls it before planning a running sequence) releases, in each
  windowed group of window ``w``, the blocks wholly before position ``num_computed_tokens - w + 1``
  (the first position the next row can see) and puts ``NULL_BLOCK`` in their table entries
  (``NULL_BLOCK`` entries are always a prefix of the table).  After a decode step a windowed
  group holds at most ``ceil(w / block_size) + 1`` blocks; a prefill chunk of ``n`` rows holds
  the blocks of ``w + n`` positions at most (all its rows' K/V are written before they attend).
- Prefix caching: every group registers its own blocks under the same chained key (the key names
  the token prefix, so it names the K/V of any layer at those positions); a block slid out of its
  window keeps its key on the LRU free list like any freed cached block.  THE RULE for a hit of
  ``k`` blocks: group 0 holds blocks ``0..k-1`` as before, and each windowed group must still
  hold, cached, the blocks covering positions ``k*bs - w + 1 .. k*bs - 1`` (what the first
  recomputed row, at ``k*bs``, sees); entries before them are ``NULL_BLOCK``, never read.  A hit
  is shortened until every group can serve it (vLLM's sliding-window rule).  So a window's blocks
  of a cached prefix are reused only while they are still in the pool, and never are read for
  positions outside the window.
- ``free``, ``truncate`` and ``slide`` skip ``NULL_BLOCK``; a block's key lives in the index of
  the group that last took it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Protocol

from attrs import define, field, frozen

from metrale_core.engine.adapter_key import adapter_of
from metrale_core.engine.request import Sequence

__all__ = ["NULL_BLOCK", "BlockHolder", "BlockManager", "PrefixCacheStats"]

#: A windowed group's table entry whose block slid out of the window (never read).
NULL_BLOCK = -1


class BlockHolder(Protocol):
    """What growing, truncating and freeing read of a sequence (a drafter's per-request state
    provides the same attributes)."""

    @property
    def request_id(self) -> str: ...

    block_ids: list[int]
    #: Tables of KV groups 1.. (models with attention windows; empty otherwise).
    group_block_ids: list[list[int]]


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
    #: The KV group that last took the block (its key is in that group's index).
    group: int = 0


@define
class BlockManager:
    """Ref-counted blocks, a free list (LRU for cached blocks) and the prefix-cache index."""

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = False
    #: Per KV group, its attention window (None: the whole context); see the module docstring.
    windows: tuple[int | None, ...] = (None,)
    _blocks: list[_Block] = field(init=False)
    #: block id -> None, in eviction order (front is taken first).
    _free: OrderedDict = field(init=False)
    #: Per KV group: prefix-cache key -> block id.
    _cached: list[dict[bytes, int]] = field(init=False)
    #: request id -> keys of its leading full blocks, in order.
    _seq_keys: dict[str, list[bytes]] = field(init=False, factory=dict)
    _queries: int = field(init=False, default=0)
    _hits: int = field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._blocks = [_Block(i) for i in range(self.num_blocks)]
        self._free = OrderedDict((i, None) for i in range(self.num_blocks))
        self._cached = [{} for _ in self.windows]

    # --- queries -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0 (cached ones included: they are evictable)."""
        return len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def num_cached_blocks(self) -> int:
        return sum(len(cached) for cached in self._cached)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    def blocks_in_use(self) -> tuple[int, ...]:
        """Per KV group, the blocks with a reference (a shared block counts once)."""
        used = [0] * self.num_groups
        for block in self._blocks:
            if block.ref_count:
                used[block.group] += 1
        return tuple(used)

    def held_blocks(self, seq: Sequence) -> tuple[int, ...]:
        """Per KV group, the blocks ``seq``'s table holds (``NULL_BLOCK`` entries not counted)."""
        return tuple(sum(b != NULL_BLOCK for b in table) for table in self._tables(seq))

    def min_blocks_for(self, num_tokens: int) -> int:
        """A lower bound on the blocks a sequence of ``num_tokens`` needs at once (a windowed
        group never needs more than its window's); more than ``num_blocks`` never fits."""
        need = self.blocks_for(num_tokens)
        return sum(need if w is None else min(need, self.blocks_for(w)) for w in self.windows)

    def _tables(self, seq: BlockHolder) -> list[list[int]]:
        """``seq``'s block table of every group, group 0 first (a holder that only ever grows, such
        as a drafter's sequence in a side pool, gets its empty group tables on first use)."""
        if self.num_groups == 1:
            return [seq.block_ids]
        if len(seq.group_block_ids) != self.num_groups - 1:
            if seq.block_ids:
                raise RuntimeError(f"{seq!r} holds blocks but not a table for each of the {self.num_groups} KV groups")
            seq.group_block_ids = [[] for _ in range(self.num_groups - 1)]
        return [seq.block_ids, *seq.group_block_ids]

    def prefix_cache_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(queries=self._queries, hits=self._hits)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` positions."""
        return -(-num_tokens // self.block_size)

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the longest prefix of ``seq``'s content (never its last token)."""
        if not self.enable_prefix_caching:
            return []
        tokens = seq.all_token_ids()[: seq.num_prefill_tokens]
        hits: list[int] = []
        parent = _salt(seq)
        bs = self.block_size
        for i in range((len(tokens) - 1) // bs):
            parent = chain_hash(parent, tokens[i * bs : (i + 1) * bs])
            block_id = self._cached[0].get(parent)
            if block_id is None:
                break
            hits.append(block_id)
        while hits and self._group_hits(hits) is None:
            hits.pop()
        return hits

    def _group_hits(self, hits: Seq[int]) -> list[list[int]] | None:
        """The tables of groups 1.. for a hit whose group-0 blocks are ``hits`` (the module
        docstring's rule), or None when some group no longer holds what the hit needs."""
        k, bs = len(hits), self.block_size
        keys = [self._blocks[b].key for b in hits]
        tables = []
        for g in range(1, self.num_groups):
            window = self.windows[g]
            first = 0 if window is None else max(0, k * bs - window + 1) // bs
            table = [NULL_BLOCK] * first
            for key in keys[first:]:
                block_id = self._cached[g].get(key) if key is not None else None
                if block_id is None:
                    return None
                table.append(block_id)
            tables.append(table)
        return tables

    def num_new_blocks(self, seq: BlockHolder, num_tokens: int) -> int:
        """Blocks ``seq`` must take from the free list to hold ``num_tokens`` positions."""
        return self.num_groups * max(0, self.blocks_for(num_tokens) - len(seq.block_ids))

    def can_allocate(self, hits: Seq[int], num_tokens: int) -> bool:
        """True when a sequence with no blocks, reusing ``hits``, can hold ``num_tokens``."""
        tables = [hits, *self._group_hits_of(hits)]
        free_hits = sum(1 for table in tables for b in table if b != NULL_BLOCK and self._blocks[b].ref_count == 0)
        needed = self.num_groups * max(0, self.blocks_for(num_tokens) - len(hits))
        return needed + free_hits <= self.num_free_blocks

    def _group_hits_of(self, hits: Seq[int]) -> list[list[int]]:
        if self.num_groups == 1:
            return []
        tables = self._group_hits(hits)
        if tables is None:
            raise RuntimeError("a prefix hit that some KV group cannot serve; use match_prefix")
        return tables

    # --- mutations ---------------------------------------------------------------------------
    def allocate(self, seq: Sequence, hits: Seq[int], num_tokens: int) -> None:
        """Give a block-less ``seq`` the ``hits`` (shared) plus fresh blocks up to ``num_tokens``.

        Sets ``seq.num_computed_tokens`` / ``num_cached_tokens`` to the tokens the hits cover.
        """
        if seq.block_ids:
            raise RuntimeError(f"{seq!r} already holds blocks")
        if not self.can_allocate(hits, num_tokens):
            raise RuntimeError(f"allocate called for {seq!r} without room; check can_allocate first")
        group_tables = self._group_hits_of(hits)
        for table in [hits, *group_tables]:
            for block_id in table:
                if block_id == NULL_BLOCK:
                    continue
                block = self._blocks[block_id]
                if block.ref_count == 0:
                    del self._free[block_id]
                block.ref_count += 1
        seq.block_ids = list(hits)
        if group_tables:
            seq.group_block_ids = group_tables
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self._queries += seq.num_prefill_tokens
            self._hits += seq.num_cached_tokens
            keys = [self._blocks[b].key for b in hits]  # cached blocks: every one has its key
            self._seq_keys[seq.request_id] = [k for k in keys if k is not None]
        self.grow(seq, num_tokens)

    def grow(self, seq: BlockHolder, num_tokens: int) -> None:
        """Append fresh blocks to ``seq`` until it holds ``num_tokens`` positions."""
        if self.num_new_blocks(seq, num_tokens) > self.num_free_blocks:
            raise RuntimeError(f"grow called for {seq!r} without room; check num_free_blocks first")
        per_group = max(0, self.blocks_for(num_tokens) - len(seq.block_ids))
        for group, table in enumerate(self._tables(seq)):
            for _ in range(per_group):
                table.append(self._take_free(group))

    def slide(self, seq: Sequence) -> None:
        """Release the windowed groups' blocks no row from ``seq.num_computed_tokens`` on can
        see (module docstring); a no-op without windows."""
        if self.windows == (None,):
            return
        start = seq.num_computed_tokens
        for window, table in zip(self.windows, self._tables(seq), strict=True):
            if window is None:
                continue
            gone = []
            i = min(len(table), max(0, start - window + 1) // self.block_size) - 1
            while i >= 0 and table[i] != NULL_BLOCK:
                gone.append(table[i])
                table[i] = NULL_BLOCK
                i -= 1
            self._release(gone)

    def truncate(self, seq: BlockHolder, num_tokens: int) -> None:
        """Give back ``seq``'s blocks past the first ``num_tokens`` positions (speculative
        rollback: they hold only rejected drafts, never a prefix-cache key)."""
        keep = self.blocks_for(num_tokens)
        tail, seq.block_ids = seq.block_ids[keep:], seq.block_ids[:keep]
        self._release(tail)
        for table in self._tables(seq)[1:]:
            tail = table[keep:]
            del table[keep:]
            self._release(tail)

    def free(self, seq: BlockHolder) -> None:
        """Drop ``seq``'s references; blocks reaching 0 go to the free list (tail first)."""
        self._release(seq.block_ids)
        seq.block_ids = []
        if self.num_groups > 1:
            for table in seq.group_block_ids:
                self._release(table)
            seq.group_block_ids = []
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
        tables = self._tables(seq)
        for j, i in enumerate(range(len(keys), num_full)):
            parent = chain_hash(parent, tokens[j * bs : (j + 1) * bs])
            keys.append(parent)
            for cached, table in zip(self._cached, tables, strict=True):
                if table[i] == NULL_BLOCK:
                    continue
                block = self._blocks[table[i]]
                if block.key is None and parent not in cached:
                    block.key = parent
                    cached[parent] = block.block_id

    def _release(self, block_ids: Seq[int]) -> None:
        for block_id in reversed(block_ids):
            if block_id == NULL_BLOCK:
                continue
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"block {block_id} freed twice")
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.key is None:
                    self._free.move_to_end(block_id, last=False)

    def _take_free(self, group: int = 0) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self._blocks[block_id]
        if block.key is not None:
            cached = self._cached[block.group]
            if cached.get(block.key) == block_id:
                del cached[block.key]
            block.key = None
        block.ref_count = 1
        block.group = group
        return block_id
