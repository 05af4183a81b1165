"""One ref-counted pool of KV blocks over integer ids: nano-vllm's block manager, vLLM v1's ``BlockPool``.

A block is *used* (ref count > 0: some request or block table points at it) or *free*. A free block
may still hold content: its key (a block hash) stays until an allocation takes the block for
something else (**lazy eviction**; vLLM ``vllm/v1/core/block_pool.py``, ``get_new_blocks`` ->
``_maybe_evict_cached_block``). Until then a lookup can still find it, and :meth:`BlockPool.touch`
takes it back off the free queue (a hit).

The free queue, front = next block an allocation takes:

1. *empty* free blocks (no key): nothing is lost by reusing them, so they go first;
2. never-used ids, handed out lazily in id order (a pool of 8 million ids costs only the blocks
   touched). With ``reuse_freed_first=False`` (nano-vllm's FIFO) 1 and 2 swap: fresh ids first;
3. *cached* free blocks in LRU order: the front one is the next victim (its key is dropped when it
   is taken, counted in ``num_evicted_blocks``).

:meth:`BlockPool.free` takes blocks in eviction order. A finished request passes its blocks **tail
first** (vLLM ``free_blocks``, called with ``reversed(blocks)``): its last block then sits ahead of
its first in the LRU, so the chain is evicted from its end. Evicting a chain's head first would
orphan the rest: a lookup stops at the first miss, so the later blocks can never hit again, yet they
keep occupying the pool until LRU reaches them.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Iterator, Sequence

from kvbench.cache.events import MEDIUM_GPU, BlockListener


class OutOfBlocksError(RuntimeError):
    """An allocation needed more free blocks than there are (check ``can_allocate`` first)."""


class BlockPool:
    """``num_blocks`` block ids from ``first_block_id`` (ids below it are reserved, e.g. vLLM's
    null block 0), with ref counts, a key per cached block and the free queue above.

    Raises (constructor): ``ValueError`` for a non-positive ``num_blocks`` or negative ``first_block_id``.
    """

    def __init__(self, num_blocks: int, first_block_id: int = 0, reuse_freed_first: bool = True) -> None:
        for name, value, minimum in (("num_blocks", num_blocks, 1), ("first_block_id", first_block_id, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        self.num_blocks = num_blocks
        self.first_block_id = first_block_id
        self._end_block_id = first_block_id + num_blocks
        self._ref_counts: list[int] = [0] * first_block_id  # index = block id, up to the last handed out
        self._empty: deque[int] = deque()  # free blocks without a key, front first
        self._lru: OrderedDict[int, None] = OrderedDict()  # free blocks with a key, next victim first
        self._keys: dict[int, Hashable] = {}  # block id -> its key, for cached blocks (used or free)
        self._holders: dict[Hashable, dict[int, None]] = {}  # key -> block ids (duplicates allowed, as vLLM)
        self._reuse_freed_first = reuse_freed_first
        # the free queue's parts in allocation order (module docstring), bound once
        empty_then_fresh = (self._take_empty, self._take_fresh)
        self._take_order = (
            *(empty_then_fresh if reuse_freed_first else empty_then_fresh[::-1]),
            self._take_victims,
        )
        self.num_evicted_blocks = 0  # keys dropped because an allocation took their block
        self.listener: BlockListener | None = None  # told every dropped key (cache/events.py)

    # -- reading state -----------------------------------------------------------------------------

    @property
    def num_never_used_blocks(self) -> int:
        return self._end_block_id - len(self._ref_counts)

    @property
    def num_free_blocks(self) -> int:
        return self.num_never_used_blocks + len(self._empty) + len(self._lru)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a key, used or free."""
        return len(self._keys)

    @property
    def num_evictable_blocks(self) -> int:
        """Free blocks still holding a key (the LRU part of the free queue)."""
        return len(self._lru)

    def ref_count(self, block_id: int) -> int:
        """Pointers at ``block_id`` (0 when free); raises ``IndexError`` outside the pool."""
        if not self.first_block_id <= block_id < self._end_block_id:
            raise IndexError(
                f"block {block_id} is outside the pool [{self.first_block_id}, {self._end_block_id})"
            )
        return self._ref_counts[block_id] if block_id < len(self._ref_counts) else 0

    def block_key(self, block_id: int) -> Hashable | None:
        return self._keys.get(block_id)

    def cached_block(self, key: Hashable) -> int | None:
        """A block holding ``key`` (the first cached of its duplicates), or ``None``."""
        holders = self._holders.get(key)
        return next(iter(holders)) if holders else None

    def held_keys(self) -> list[Hashable]:
        """The key of every keyed block, used or free (a key held by two blocks appears twice)."""
        return list(self._keys.values())

    def used_block_ids(self) -> Iterator[int]:
        """Ids with ref count > 0, ascending."""
        ref_counts = self._ref_counts
        return (block_id for block_id in range(self.first_block_id, len(ref_counts)) if ref_counts[block_id])

    def evictable_block_ids(self) -> Iterator[int]:
        """Cached free blocks, next victim first."""
        return iter(self._lru)

    # -- actions -----------------------------------------------------------------------------------

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` from the front of the free queue at ref count 1, dropping the keys of
        cached ones (lazy eviction). Raises :class:`OutOfBlocksError` (changing nothing) when short."""
        if num_blocks > self.num_free_blocks:
            raise OutOfBlocksError(f"need {num_blocks} free blocks, have {self.num_free_blocks}")
        block_ids: list[int] = []
        for take in self._take_order:
            if len(block_ids) < num_blocks:
                take(num_blocks - len(block_ids), block_ids)
        return block_ids

    def touch(self, block_ids: Sequence[int]) -> None:
        """One more pointer at each block (a hit, a fork); a free cached block leaves the free queue.

        Raises:
            ValueError: a block is free and holds no key (there is nothing to hit).
        """
        ref_counts, lru = self._ref_counts, self._lru
        for block_id in block_ids:
            ref_count = ref_counts[block_id]
            if not ref_count:
                if block_id not in lru:
                    raise ValueError(f"block {block_id} is free and holds no key")
                del lru[block_id]
            ref_counts[block_id] = ref_count + 1

    def cache(self, block_id: int, key: Hashable) -> None:
        """Record that used block ``block_id`` now holds ``key`` (a full block's hash).

        Raises:
            ValueError: the block is free or already holds a key.
        """
        if not self.ref_count(block_id) or block_id in self._keys:
            raise ValueError(f"block {block_id} must be used and hold no key to cache one")
        self._keys[block_id] = key
        holders = self._holders.get(key)
        if holders is None:
            self._holders[key] = {block_id: None}
        else:
            holders[block_id] = None

    def uncache(self, block_id: int) -> None:
        """Drop ``block_id``'s key now (a TTL expiry); a free block moves to the front of the queue's
        empty part. Raises ``KeyError`` if the block holds no key."""
        self._drop_key(block_id)
        if block_id in self._lru:
            del self._lru[block_id]
            self._empty.appendleft(block_id)

    def free(self, block_ids: Iterable[int]) -> list[int]:
        """One pointer less at each block, given in eviction order (a request's blocks: tail first).

        Blocks reaching 0 join the free queue: cached ones at the back of the LRU in the given order,
        empty ones at the front (vLLM ``free_blocks``; with ``reuse_freed_first=False`` behind the
        other empty ones, nano-vllm's FIFO).

        Returns the blocks that became free, in the given order.

        Raises:
            ValueError: a block that is already free (blocks before it in ``block_ids`` were freed).
        """
        ref_counts, keys, lru = self._ref_counts, self._keys, self._lru
        released, emptied = [], []
        for block_id in block_ids:
            ref_count = ref_counts[block_id]
            if not ref_count:
                raise ValueError(f"block {block_id} released more often than it was taken")
            ref_counts[block_id] = ref_count - 1
            if ref_count == 1:
                released.append(block_id)
                if block_id in keys:
                    lru[block_id] = None
                else:
                    emptied.append(block_id)
        if emptied:
            if self._reuse_freed_first:
                self._empty.extendleft(reversed(emptied))
            else:
                self._empty.extend(emptied)
        return released

    # -- internals ---------------------------------------------------------------------------------

    def _take_empty(self, num_blocks: int, block_ids: list[int]) -> None:
        ref_counts, popleft = self._ref_counts, self._empty.popleft
        for _ in range(min(num_blocks, len(self._empty))):
            block_id = popleft()
            ref_counts[block_id] = 1
            block_ids.append(block_id)

    def _take_fresh(self, num_blocks: int, block_ids: list[int]) -> None:
        ref_counts = self._ref_counts
        num_fresh = min(num_blocks, self.num_never_used_blocks)
        block_ids.extend(range(len(ref_counts), len(ref_counts) + num_fresh))
        ref_counts.extend([1] * num_fresh)

    def _take_victims(self, num_blocks: int, block_ids: list[int]) -> None:
        ref_counts, pop = self._ref_counts, self._lru.popitem
        for _ in range(num_blocks):
            block_id = pop(last=False)[0]
            self._drop_key(block_id)
            ref_counts[block_id] = 1
            block_ids.append(block_id)
        self.num_evicted_blocks += num_blocks

    def _drop_key(self, block_id: int) -> None:
        key = self._keys.pop(block_id)
        holders = self._holders[key]
        del holders[block_id]
        if not holders:
            del self._holders[key]
        if self.listener is not None:
            self.listener.removed(key, MEDIUM_GPU)

    # -- checking ----------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless ref counts, the free queue and the keys agree."""
        ref_counts, empty, lru = self._ref_counts, list(self._empty), self._lru
        if len(ref_counts) > self._end_block_id or any(ref_counts[: self.first_block_id]):
            raise AssertionError("ref counts outside the pool")
        if any(ref_count < 0 for ref_count in ref_counts):
            raise AssertionError("a negative ref count")
        free = set(empty) | set(lru)
        if len(free) != len(empty) + len(lru):
            raise AssertionError("a block is on the free queue twice")
        at_zero = {b for b in range(self.first_block_id, len(ref_counts)) if not ref_counts[b]}
        if free != at_zero:
            raise AssertionError(f"free queue and ref counts disagree: {sorted(free ^ at_zero)}")
        if any(block_id in self._keys for block_id in empty) or any(
            block_id not in self._keys for block_id in lru
        ):
            raise AssertionError("an empty free block holds a key, or a cached free block holds none")
        expected: dict[Hashable, set[int]] = {}
        for block_id, key in self._keys.items():
            expected.setdefault(key, set()).add(block_id)
        if {key: set(blocks) for key, blocks in self._holders.items()} != expected:
            raise AssertionError("the key -> blocks map and the block -> key map disagree")
