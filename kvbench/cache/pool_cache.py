"""The TTL of the prefix cache the paged engine keeps in one :class:`~kvbench.cache.block_pool.BlockPool`.

The paged engine (:mod:`kvbench.engine.paged.scheduler`) keeps its prefix cache in the pool itself, as
vLLM v1 does: a cached block is a pool block id holding a key (:mod:`kvbench.cache.block_index`),
findable after release until an allocation evicts it. vLLM itself has no TTL (blocks leave only by
eviction); this is the rule of API prompt caches (Anthropic's 5-minute cache), kept so ``--ttl`` means
the same on both engines: a free cached block idle for longer than ``ttl_s`` since its release is not
a hit; the sweep before every lookup drops its key (``BlockPool.uncache``), as the hash cache's
``_sweep`` does (the same rule: ``kvbench.cache.base`` ``CacheConfig.ttl_s``; a hit pins the block,
and the next release restarts its timer). The pool's LRU part of the free queue is ordered by release
time, so the expired blocks are its front.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from kvbench.cache.base import Clock
from kvbench.cache.block_pool import BlockPool


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
