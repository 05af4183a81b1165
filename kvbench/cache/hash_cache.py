"""The hash-table prefix cache (vLLM v1 style): chained block keys -> blocks, plus an LRU free list.

State:

* ``_table``: block key -> :class:`CachedBlock`, every block held (pinned or not).
* ``_free``: the unpinned blocks in eviction order, front = next victim. An ``OrderedDict`` gives
  O(1) removal from the middle (a hit revives a free block) and O(1) pop from the front, like vLLM's
  doubly linked ``FreeKVCacheBlockQueue``.

Eviction order (vLLM ``vllm/v1/core/block_pool.py``, ``free_blocks``): a finished request's blocks
are appended to the free list *tail first*, so within a chain the tail is older and goes first.
Evicting a head first would orphan the rest of its chain: a lookup stops at the first miss, so the
surviving later blocks can never be hit again, yet they keep occupying capacity until they age out.

Why not :class:`kvbench.cache.block_pool.BlockPool` (the pool the vLLM simulator and the memory
block manager share): this is the simulator's hot loop, and keeping ref counts and the free list on
the block objects themselves, keyed by hash, is ~4x faster than going through integer ids (measured
with ``benchmarks/sim_bench.py``; the same numbers either way). The eviction rules are the pool's.

A hit trusts its key, as vLLM does. With ``verify_tokens`` the stored token bytes are compared too
(nano-vllm's ``can_allocate``); a mismatch then counts as a miss and in ``num_rejected_hits``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from kvbench.cache.base import (
    CacheConfig,
    CacheStats,
    Clock,
    InsertResult,
    MatchResult,
    ReleaseOrder,
    insert_range,
)
from kvbench.cache.block_hash import BlockHash, PromptBlocks
from kvbench.cache.events import MEDIUM_GPU, BlockListener, token_ids_of
from kvbench.errors import CacheBusyError


class CachedBlock:
    """One cached block.

    Attributes:
        block_hash: its chained key.
        token_bytes: the block's token ids, fixed-width bytes (``None`` if the prompt had none).
        payload: whatever the caller stored (the engine: per-layer K/V tensors of this block).
        ref_count: requests currently using it; > 0 means pinned (never evicted).
        last_used_s: clock reading of its last hit or release (the TTL's idle timer).
    """

    __slots__ = ("block_hash", "token_bytes", "payload", "ref_count", "last_used_s")

    def __init__(
        self, block_hash: BlockHash, token_bytes: bytes | None, payload: Any, last_used_s: float
    ) -> None:
        self.block_hash = block_hash
        self.token_bytes = token_bytes
        self.payload = payload
        self.ref_count = 1  # created by an insert, which pins it for the inserting request
        self.last_used_s = last_used_s

    def __repr__(self) -> str:
        return f"CachedBlock({self.block_hash.hex()[:12]}, ref_count={self.ref_count})"


def _payloads_of(handles: list[CachedBlock], num_hit_blocks: int) -> list[Any]:
    return [block.payload for block in handles]


class HashPrefixCache:
    """Hash table of block keys with ref counts, an LRU free list and an optional TTL.

    Capacity counts every held block, pinned or not. Construct from a :class:`CacheConfig`; the
    clock (seconds) is injectable for TTL tests.
    """

    def __init__(self, config: CacheConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.stats = CacheStats(block_size=config.block_size)
        self._clock = clock or time.monotonic
        self._table: dict[BlockHash, CachedBlock] = {}
        self._free: OrderedDict[BlockHash, CachedBlock] = OrderedDict()
        self._tail_first = config.release_order is ReleaseOrder.TAIL_FIRST
        self.listener: BlockListener | None = None  # told every store and removal (cache/events.py)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._table)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self._free)

    @property
    def num_pinned_blocks(self) -> int:
        return len(self._table) - len(self._free)

    def lookup(self, prompt: PromptBlocks, max_hit_blocks: int | None = None) -> MatchResult:
        """Longest cached prefix of ``prompt``, at most ``max_hit_blocks`` blocks, pinned.

        Raises:
            ValueError: ``verify_tokens`` is on but ``prompt`` carries no token bytes.
        """
        expired = self._sweep(self._clock()) if self.config.ttl_s is not None else 0
        keys = prompt.block_hashes
        if max_hit_blocks is not None and max_hit_blocks < len(keys):
            keys = keys[: max(max_hit_blocks, 0)]
        table, free = self._table, self._free
        hits: list[CachedBlock] = []
        if self.config.verify_tokens:
            self._verified_hits(prompt, keys, hits)
        else:
            for key in keys:
                block = table.get(key)
                if block is None:
                    break
                ref_count = block.ref_count
                if not ref_count:
                    del free[key]  # a hit revives a free block: pinned again, off the free list
                block.ref_count = ref_count + 1
                hits.append(block)
        stats = self.stats
        stats.num_lookups += 1
        stats.num_queried_blocks += len(keys)
        stats.num_hit_blocks += len(hits)
        return MatchResult(len(hits), hits, _payloads_of, expired)

    def _verified_hits(
        self, prompt: PromptBlocks, keys: Sequence[BlockHash], hits: list[CachedBlock]
    ) -> None:
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
            if not block.ref_count:
                del self._free[key]
            block.ref_count += 1
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
        twice. When the cache is full it evicts from the front of the free list; when nothing is
        evictable it refuses the remaining blocks (an insert never evicts a pinned block).

        Raises:
            ValueError: the range is outside the prompt, or ``payloads`` has the wrong length.
        """
        start, stop = insert_range(prompt, start_block, payloads, stop_block)
        now = self._clock()
        table, free = self._table, self._free
        capacity = self.config.capacity_blocks
        keys, tokens = prompt.block_hashes, prompt.block_tokens
        handles: list[CachedBlock] = []
        num_existing = num_refused = num_evicted = 0
        num_held = len(table)
        for index in range(start, stop):
            key = keys[index]
            block = table.get(key)
            if block is not None:  # stored meanwhile by another request: share it
                if not block.ref_count:
                    del free[key]
                block.ref_count += 1
                handles.append(block)
                num_existing += 1
                continue
            if num_held >= capacity:
                if not free:
                    num_refused = stop - index
                    break
                block = self._reuse_victim(
                    key,
                    tokens[index] if tokens is not None else None,
                    payloads[index - start] if payloads is not None else None,
                    now,
                )
                num_evicted += 1
            else:
                num_held += 1
                block = CachedBlock(
                    key,
                    tokens[index] if tokens is not None else None,
                    payloads[index - start] if payloads is not None else None,
                    now,
                )
            table[key] = block
            handles.append(block)
            if self.listener is not None:
                self._tell_stored(prompt, index)
        num_inserted = len(handles) - num_existing
        self.stats.num_evicted_blocks += num_evicted
        self.stats.num_inserted_blocks += num_inserted
        self.stats.num_refused_blocks += num_refused
        return InsertResult(num_inserted, num_existing, num_refused, handles, num_evicted)

    def _tell_stored(self, prompt: PromptBlocks, index: int) -> None:
        tokens = prompt.block_tokens
        token_ids = token_ids_of(tokens[index]) if tokens is not None else ()
        parent = prompt.block_hashes[index - 1] if index else None
        self.listener.stored(prompt.block_hashes[index], parent, token_ids, MEDIUM_GPU)

    def _reuse_victim(
        self, key: BlockHash, token_bytes: bytes | None, payload: Any, now: float
    ) -> CachedBlock:
        """Evict the front of the free list and reuse its object for ``key``, pinned, as vLLM's
        BlockPool reuses physical blocks: the old key and payload are dropped here (lazy eviction
        at reallocation)."""
        victim_key, block = self._free.popitem(last=False)
        del self._table[victim_key]
        if self.listener is not None:
            self.listener.removed(victim_key, MEDIUM_GPU)
        block.block_hash, block.token_bytes, block.payload = key, token_bytes, payload
        block.ref_count, block.last_used_s = 1, now
        return block

    def release(self, handles: Sequence[CachedBlock]) -> None:
        """Unpin blocks given in chain order (head first, as lookup and insert return them).

        They join the free list tail first (or head first, to demonstrate the bug).

        Raises:
            ValueError: a block released more often than it was pinned.
        """
        now = self._clock()
        free = self._free
        for block in reversed(handles) if self._tail_first else handles:
            ref_count = block.ref_count - 1
            block.last_used_s = now
            if ref_count > 0:
                block.ref_count = ref_count
            elif ref_count == 0:
                block.ref_count = 0
                free[block.block_hash] = block
            else:
                raise ValueError(f"{block!r} released more often than it was pinned")

    def sweep(self) -> int:
        """Drop unpinned blocks idle for longer than the TTL now; returns how many."""
        return self._sweep(self._clock()) if self.config.ttl_s is not None else 0

    def _sweep(self, now: float) -> int:
        # The free list is ordered by last use (every release appends at the back with the current
        # time), so the expired blocks are a prefix of it.
        oldest_kept_s = now - self.config.ttl_s
        free, table = self._free, self._table
        num_expired = 0
        while free:
            key, block = next(iter(free.items()))
            if block.last_used_s >= oldest_kept_s:
                break
            free.popitem(last=False)
            del table[key]
            num_expired += 1
            if self.listener is not None:
                self.listener.removed(key, MEDIUM_GPU)
        self.stats.num_expired_blocks += num_expired
        return num_expired

    def reset(self) -> None:
        """Drop every block (vLLM's ``reset_prefix_cache``). Raises ``CacheBusyError`` if pinned."""
        if self.num_pinned_blocks:
            raise CacheBusyError(f"cannot reset: {self.num_pinned_blocks} blocks are pinned")
        self._table.clear()
        self._free.clear()
        if self.listener is not None:
            self.listener.cleared()

    def held_keys(self) -> list[BlockHash]:
        """The key of every held block (pinned or not), for checking a listener's view."""
        return list(self._table)

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the table, ref counts and free list disagree."""
        table, free = self._table, self._free
        if len(table) > self.config.capacity_blocks:
            raise AssertionError(f"{len(table)} blocks held, capacity {self.config.capacity_blocks}")
        for key, block in table.items():
            if block.block_hash != key:
                raise AssertionError(f"{block!r} stored under another key")
            if block.ref_count < 0:
                raise AssertionError(f"{block!r} has a negative ref count")
            if (block.ref_count == 0) != (key in free):
                raise AssertionError(f"{block!r}: free list membership disagrees with ref count")
        last_used_s = float("-inf")
        for key, block in free.items():
            if table.get(key) is not block:
                raise AssertionError(f"free block {block!r} is not in the table")
            if block.last_used_s < last_used_s:
                raise AssertionError("free list is not ordered by last use")
            last_used_s = block.last_used_s
