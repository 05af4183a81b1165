"""The hash-table prefix cache (vLLM v1 style): chained block keys -> blocks of a :class:`BlockPool`.

State:

* ``_pool``: a :class:`~kvbench.cache.block_pool.BlockPool` of ``capacity_blocks`` block ids: ref
  counts (> 0 = pinned) and the free queue, whose front is the next victim (vLLM's
  ``FreeKVCacheBlockQueue``). A released block keeps its key until an insert takes its id (lazy
  eviction); a hit takes it back off the queue (``touch``).
* ``_table``: block key -> :class:`CachedBlock`, every block held (pinned or not);
  ``_blocks[block_id]`` is the same object by id.

Eviction order (vLLM ``vllm/v1/core/block_pool.py``, ``free_blocks``): a finished request's blocks
are released *tail first*, so within a chain the tail is older and goes first. Evicting a head
first would orphan the rest of its chain: a lookup stops at the first miss, so the surviving later
blocks can never hit again, yet they keep occupying capacity until they age out.

A hit trusts its key, as vLLM does. With ``verify_tokens`` the stored token bytes are compared too
(nano-vllm's ``can_allocate``); a mismatch then counts as a miss and in ``num_rejected_hits``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kvbench.cache.block_hash import BlockHash, PromptBlocks
from kvbench.cache.block_pool import BlockPool
from kvbench.cache.base import (
    CacheConfig,
    CacheKind,
    CacheStats,
    Clock,
    InsertResult,
    MatchResult,
    ReleaseOrder,
    insert_range,
    register_cache,
)
from kvbench.errors import CacheBusyError


class CachedBlock:
    """One cached block (its ref count lives in the pool, under ``block_id``).

    Attributes:
        block_id: its id in the cache's :class:`BlockPool`.
        block_hash: its chained key.
        token_bytes: the block's token ids, fixed-width bytes (``None`` if the prompt had none).
        payload: whatever the caller stored (the engine: per-layer K/V tensors of this block).
        last_used_s: clock reading of its last hit or release (the TTL's idle timer).
    """

    __slots__ = ("block_id", "block_hash", "token_bytes", "payload", "last_used_s")

    def __init__(self, block_id: int, block_hash: BlockHash, token_bytes: bytes | None, payload: Any,
                 last_used_s: float) -> None:
        self.block_id = block_id
        self.block_hash = block_hash
        self.token_bytes = token_bytes
        self.payload = payload
        self.last_used_s = last_used_s

    def __repr__(self) -> str:
        return f"CachedBlock({self.block_id}, {self.block_hash.hex()[:12]})"


def _payloads_of(handles: list[CachedBlock], num_hit_blocks: int) -> list[Any]:
    return [block.payload for block in handles]


@register_cache(CacheKind.HASH)
class HashPrefixCache:
    """Hash table of block keys over a ref-counted block pool, with an LRU free queue and an optional TTL.

    Capacity counts every held block, pinned or not. Construct from a :class:`CacheConfig`; the
    clock (seconds) is injectable for TTL tests.
    """

    def __init__(self, config: CacheConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.stats = CacheStats(block_size=config.block_size)
        self._clock = clock or time.monotonic
        self._pool = BlockPool(config.capacity_blocks)
        self._table: dict[BlockHash, CachedBlock] = {}
        self._blocks: list[CachedBlock | None] = []  # by block id, for the ids handed out so far
        self._tail_first = config.release_order is ReleaseOrder.TAIL_FIRST

    @property
    def num_cached_blocks(self) -> int:
        return len(self._table)

    @property
    def num_evictable_blocks(self) -> int:
        return self._pool.num_evictable_blocks

    @property
    def num_pinned_blocks(self) -> int:
        return self._pool.num_used_blocks

    def lookup(self, prompt: PromptBlocks, max_hit_blocks: int | None = None) -> MatchResult:
        """Longest cached prefix of ``prompt``, at most ``max_hit_blocks`` blocks, pinned.

        Raises:
            ValueError: ``verify_tokens`` is on but ``prompt`` carries no token bytes.
        """
        expired = self._sweep(self._clock()) if self.config.ttl_s is not None else 0
        keys = prompt.block_hashes
        if max_hit_blocks is not None and max_hit_blocks < len(keys):
            keys = keys[: max(max_hit_blocks, 0)]
        hits: list[CachedBlock] = []
        if self.config.verify_tokens:
            self._verified_hits(prompt, keys, hits)
        else:
            table = self._table
            for key in keys:
                block = table.get(key)
                if block is None:
                    break
                hits.append(block)
        self._pool.touch([block.block_id for block in hits])  # pinned again, off the free queue
        stats = self.stats
        stats.num_lookups += 1
        stats.num_queried_blocks += len(keys)
        stats.num_hit_blocks += len(hits)
        return MatchResult(len(hits), hits, _payloads_of, expired)

    def _verified_hits(self, prompt: PromptBlocks, keys: Sequence[BlockHash], hits: list[CachedBlock]) -> None:
        """The lookup loop with nano-vllm's guard: a key hit counts only if the tokens agree too."""
        if prompt.block_tokens is None:
            raise ValueError("verify_tokens needs prompts built with their token bytes")
        for key, token_bytes in zip(keys, prompt.block_tokens):
            block = self._table.get(key)
            if block is None:
                break
            if block.token_bytes != token_bytes:
                self.stats.num_rejected_hits += 1
                break
            hits.append(block)

    def insert(
        self,
        prompt: PromptBlocks,
        start_block: int,
        payloads: Sequence[Any] | None = None,
        stop_block: int | None = None,
    ) -> InsertResult:
        """Store blocks ``start_block .. stop_block`` of ``prompt`` (default: to the last full one).

        Each stored block is pinned for the caller. A key already cached is pinned instead of stored
        twice. A new block takes the front of the pool's free queue (an empty block, else the LRU
        victim, whose key is dropped); when nothing is free it refuses the remaining blocks (an
        insert never evicts a pinned block).

        Raises:
            ValueError: the range is outside the prompt, or ``payloads`` has the wrong length.
        """
        start, stop = insert_range(prompt, start_block, payloads, stop_block)
        now = self._clock()
        table, pool = self._table, self._pool
        keys, tokens = prompt.block_hashes, prompt.block_tokens
        handles: list[CachedBlock] = []
        num_existing = num_refused = 0
        num_evicted = pool.num_evicted_blocks
        for index in range(start, stop):
            key = keys[index]
            block = table.get(key)
            if block is not None:  # stored meanwhile by another request: share it
                pool.touch((block.block_id,))
                num_existing += 1
            elif not pool.num_free_blocks:
                num_refused = stop - index
                break
            else:
                block = self._store(key, tokens[index] if tokens is not None else None,
                                    payloads[index - start] if payloads is not None else None, now)
            handles.append(block)
        num_inserted = len(handles) - num_existing
        self.stats.num_evicted_blocks += pool.num_evicted_blocks - num_evicted
        self.stats.num_inserted_blocks += num_inserted
        self.stats.num_refused_blocks += num_refused
        return InsertResult(num_inserted, num_existing, num_refused, handles)

    def _store(self, key: BlockHash, token_bytes: bytes | None, payload: Any, now: float) -> CachedBlock:
        """Take a free block for ``key``, pinned; reuses an evicted block's object, as vLLM's
        ``BlockPool`` reuses physical blocks (the old key and payload are dropped here)."""
        [block_id] = self._pool.allocate(1)
        self._pool.cache(block_id, key)
        blocks = self._blocks
        if block_id == len(blocks):
            block = CachedBlock(block_id, key, token_bytes, payload, now)
            blocks.append(block)
        else:
            block = blocks[block_id]
            if block is None:  # an expired block's id
                block = blocks[block_id] = CachedBlock(block_id, key, token_bytes, payload, now)
            else:  # the LRU victim
                del self._table[block.block_hash]
                block.block_hash, block.token_bytes, block.payload, block.last_used_s = key, token_bytes, payload, now
        self._table[key] = block
        return block

    def release(self, handles: Sequence[CachedBlock]) -> None:
        """Unpin blocks given in chain order (head first, as lookup and insert return them).

        They join the free queue tail first (or head first, to demonstrate the bug).

        Raises:
            ValueError: a block released more often than it was pinned.
        """
        now = self._clock()
        ordered = reversed(handles) if self._tail_first else handles
        block_ids = []
        for block in ordered:
            block.last_used_s = now
            block_ids.append(block.block_id)
        self._pool.free(block_ids)

    def sweep(self) -> int:
        """Drop unpinned blocks idle for longer than the TTL now; returns how many."""
        return self._sweep(self._clock()) if self.config.ttl_s is not None else 0

    def _sweep(self, now: float) -> int:
        # The free queue's LRU part is ordered by last use (every release appends at the back with
        # the current time), so the expired blocks are a prefix of it.
        oldest_kept_s = now - self.config.ttl_s
        expired = []
        for block_id in self._pool.evictable_block_ids():
            if self._blocks[block_id].last_used_s >= oldest_kept_s:
                break
            expired.append(block_id)
        for block_id in expired:
            self._pool.uncache(block_id)
            del self._table[self._blocks[block_id].block_hash]
            self._blocks[block_id] = None
        self.stats.num_expired_blocks += len(expired)
        return len(expired)

    def reset(self) -> None:
        """Drop every block (vLLM's ``reset_prefix_cache``). Raises ``CacheBusyError`` if pinned."""
        if self.num_pinned_blocks:
            raise CacheBusyError(f"cannot reset: {self.num_pinned_blocks} blocks are pinned")
        self._pool = BlockPool(self.config.capacity_blocks)
        self._table.clear()
        self._blocks.clear()

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the table, the blocks by id and the pool disagree."""
        table, pool = self._table, self._pool
        pool.check_invariants()
        if len(table) > self.config.capacity_blocks or len(table) != pool.num_cached_blocks:
            raise AssertionError(f"{len(table)} blocks in the table, {pool.num_cached_blocks} cached in the "
                                 f"pool, capacity {self.config.capacity_blocks}")
        for key, block in table.items():
            if block.block_hash != key or self._blocks[block.block_id] is not block:
                raise AssertionError(f"{block!r} stored under another key or id")
            if pool.block_key(block.block_id) != key:
                raise AssertionError(f"{block!r}: the pool holds another key for its id")
        last_used_s = float("-inf")
        for block_id in pool.evictable_block_ids():
            if self._blocks[block_id].last_used_s < last_used_s:
                raise AssertionError("free queue is not ordered by last use")
            last_used_s = self._blocks[block_id].last_used_s
