"""The prefix cache over one :class:`~kvbench.cache.block_pool.BlockPool`: the paged engine's rules as a
:class:`~kvbench.cache.base.PrefixCache`, plus the TTL both share.

The paged engine (:mod:`kvbench.engine.paged.scheduler`) keeps its prefix cache in the pool itself, as
vLLM v1 does: a cached block is a pool block id holding a key (its chained block hash, or for the
radix kind ``(parent block, token bytes)``: :mod:`kvbench.cache.block_index`), pinned while a block
table points at it, findable after release until an allocation evicts it (lazy eviction; LRU; a
chain's tail first, for radix the LRU leaf). :class:`PoolPrefixCache` exposes exactly those
operations through the protocol the hash and radix caches implement, so the one contract suite
(``tests/cache``) checks the engine's cache rules: pinned never evicted, tail-first release, salts,
the last-token cap, TTL. For radix an insert's handles pin the whole path from block 0 (SGLang's
``inc_lock_ref`` walks to the root), so a caller releasing its hit first never leaves a pinned block
under a free parent.

TTL (:class:`IdleTimer`, used by this adapter and by the scheduler): a free cached block idle for
longer than ``ttl_s`` since its release is not a hit; the sweep before every lookup drops its key
(``BlockPool.uncache``), as the hash cache's ``_sweep`` does (the same rule: ``kvbench.cache.base``
``CacheConfig.ttl_s``; a hit pins the block, and the next release restarts its timer). The pool's
LRU part of the free queue is ordered by release time, so the expired blocks are its front.
vLLM itself has no TTL (blocks leave only by eviction); this is the rule of API prompt caches
(Anthropic's 5-minute cache), kept so ``--ttl`` means the same on both engines.

Payloads: the engine stores none (its K/V is in the pool at the block id); the adapter keeps one per
block id only so the contract's payload test runs unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from kvbench.cache.base import (
    CacheConfig,
    CacheKind,
    CacheStats,
    Clock,
    InsertResult,
    MatchResult,
    ReleaseOrder,
    insert_range,
)
from kvbench.cache.block_hash import BlockHasher, PromptBlocks
from kvbench.cache.block_index import PoolIndex
from kvbench.cache.block_pool import BlockPool
from kvbench.errors import CacheBusyError


class IdleTimer:
    """Release times of a pool's free cached blocks, and the TTL sweep over them.

    ``ttl_s`` ``None``: nothing expires and nothing is recorded. Times are ``clock()`` seconds.
    """

    def __init__(self, pool: BlockPool, ttl_s: float | None, clock: Clock | None = None) -> None:
        self.pool = pool
        self.ttl_s = ttl_s
        self.clock = clock or time.monotonic
        self._released_s: dict[int, float] = {}  # block id -> when it last became free
        self.num_expired_blocks = 0

    def released(self, block_ids: Iterable[int]) -> None:
        """``block_ids`` just reached ref count 0 (what ``BlockPool.free`` returns): start their timers."""
        if self.ttl_s is not None:
            now = self.clock()
            for block_id in block_ids:
                self._released_s[block_id] = now

    def sweep(self) -> int:
        """Drop the keys of free cached blocks idle for longer than ``ttl_s`` now; returns how many."""
        if self.ttl_s is None:
            return 0
        oldest_kept_s = self.clock() - self.ttl_s
        expired = []
        for block_id in self.pool.evictable_block_ids():  # release order, oldest first
            if self._released_s.get(block_id, oldest_kept_s) >= oldest_kept_s:
                break
            expired.append(block_id)
        for block_id in expired:
            self.pool.uncache(block_id)
            del self._released_s[block_id]
        self.num_expired_blocks += len(expired)
        return len(expired)


class PoolPrefixCache:
    """A :class:`~kvbench.cache.base.PrefixCache` whose blocks are ids of one :class:`BlockPool` of
    ``config.capacity_blocks`` blocks (module docstring), keyed by ``config.kind``. Handles are block ids.

    Raises (constructor): ``ValueError`` for ``verify_tokens`` (hash keys are trusted, as vLLM's; radix keys
    are the tokens themselves).
    """

    def __init__(self, config: CacheConfig, clock: Clock | None = None) -> None:
        if config.verify_tokens:
            raise ValueError(
                "a pool-backed cache does not implement verify_tokens (hash trusts keys; radix compares "
                "tokens)"
            )
        self.config = config
        self.stats = CacheStats(block_size=config.block_size)
        self.pool = BlockPool(config.capacity_blocks)
        self.index = PoolIndex(self.pool, BlockHasher(config.block_size, config.hash), config.kind)
        self._radix = config.kind is CacheKind.RADIX
        self.timer = IdleTimer(self.pool, config.ttl_s, clock)
        self._tail_first = config.release_order is ReleaseOrder.TAIL_FIRST
        self._payloads: dict[int, Any] = {}

    @property
    def num_cached_blocks(self) -> int:
        return self.pool.num_cached_blocks

    @property
    def num_evictable_blocks(self) -> int:
        return self.pool.num_evictable_blocks

    def lookup(self, prompt: PromptBlocks, max_hit_blocks: int | None = None) -> MatchResult:
        """Sweep expired blocks, then pin and return the longest cached prefix (at most
        ``max_hit_blocks``)."""
        expired = self.sweep()
        keys, namespace = self._keys(prompt)
        if max_hit_blocks is not None and max_hit_blocks < len(keys):
            keys = keys[: max(max_hit_blocks, 0)]
        hit = self.index.cached_prefix(keys, namespace)
        self.pool.touch(hit)
        self.stats.num_lookups += 1
        self.stats.num_queried_blocks += len(keys)
        self.stats.num_hit_blocks += len(hit)
        return MatchResult(len(hit), hit, self._payloads_of, expired)

    def insert(
        self,
        prompt: PromptBlocks,
        start_block: int,
        payloads: Sequence[Any] | None = None,
        stop_block: int | None = None,
    ) -> InsertResult:
        """Store blocks ``start_block .. stop_block`` pinned: a key the pool holds is pinned instead; a new
        one takes the free queue's front block (evicting its key); none free = the rest is refused.
        Radix: the handles also pin blocks ``0 .. start_block`` again (module docstring).

        Raises:
            ValueError: the range is outside the prompt, ``payloads`` has the wrong length, or (radix)
                a block before ``start_block`` is not cached.
        """
        start, stop = insert_range(prompt, start_block, payloads, stop_block)
        pool, index_ = self.pool, self.index
        keys, namespace = self._keys(prompt)
        path = index_.cached_prefix(keys[:start], namespace) if self._radix else []
        if len(path) < start and self._radix:
            raise ValueError(
                f"blocks before start_block {start} must be cached (the caller's pinned hit); "
                f"only {len(path)} are"
            )
        pool.touch(path)
        handles, parent = list(path), path[-1] if path else None
        num_existing = num_refused = 0
        evicted_before = pool.num_evicted_blocks
        for index in range(start, stop):
            key = index_.key(parent, keys, index, namespace)
            block_id = pool.cached_block(key)
            if block_id is not None:
                pool.touch([block_id])
                num_existing += 1
            elif pool.can_allocate(1):
                block_id = pool.allocate(1)[0]
                pool.cache(block_id, key)
                self._payloads[block_id] = payloads[index - start] if payloads is not None else None
            else:
                num_refused = stop - index
                break
            handles.append(block_id)
            parent = block_id
        num_inserted = len(handles) - len(path) - num_existing
        num_evicted = pool.num_evicted_blocks - evicted_before
        self.stats.num_evicted_blocks += num_evicted
        self.stats.num_inserted_blocks += num_inserted
        self.stats.num_refused_blocks += num_refused
        return InsertResult(num_inserted, num_existing, num_refused, handles, num_evicted)

    def release(self, handles: Sequence[int]) -> None:
        """Unpin blocks given in chain order; they join the free queue tail first (or head first).

        Raises:
            ValueError: a block released more often than it was pinned.
        """
        self.timer.released(self.pool.free(reversed(handles) if self._tail_first else handles))

    def sweep(self) -> int:
        """Drop free blocks idle for longer than the TTL now; returns how many."""
        expired = self.timer.sweep()
        self.stats.num_expired_blocks += expired
        return expired

    def reset(self) -> None:
        """Drop every key (vLLM's ``reset_prefix_cache``). Raises ``CacheBusyError`` if a block is pinned."""
        if self.pool.num_used_blocks:
            raise CacheBusyError(f"cannot reset: {self.pool.num_used_blocks} blocks are pinned")
        for block_id in list(self.pool.evictable_block_ids()):
            self.pool.uncache(block_id)
        self._payloads.clear()

    def _keys(self, prompt: PromptBlocks) -> tuple[Sequence[Any], bytes]:
        """The prompt's block keys for this kind (:class:`PoolIndex`) and its namespace."""
        if not self._radix:
            return prompt.block_hashes, prompt.namespace
        if prompt.block_tokens is None:
            raise ValueError("the radix kind needs prompts built with their token bytes")
        return prompt.block_tokens, prompt.namespace

    def check_invariants(self) -> None:
        """The pool's and the index's invariants; every used block holds a key (the adapter pins only
        cached blocks)."""
        self.index.check_invariants()
        for block_id in self.pool.used_block_ids():
            if self.pool.block_key(block_id) is None:
                raise AssertionError(f"used block {block_id} holds no key")

    def _payloads_of(self, handles: list[int], num_hit_blocks: int) -> list[Any]:
        return [self._payloads.get(block_id) for block_id in handles]
