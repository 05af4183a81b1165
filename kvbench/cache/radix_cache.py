"""The radix-tree prefix cache (SGLang style): cached prefixes as a tree of token runs.

Each node holds a run of whole blocks (an edge of the tree); children are keyed by the token bytes
of their first block (SGLang keys children by the first page when ``page_size > 1``). One tree per
namespace (salt + extra keys), like SGLang's ``extra_key``. Matching compares token ids, so a radix
cache cannot suffer a hash collision.

Pinning follows SGLang's ``inc_lock_ref`` / ``dec_lock_ref``: a handle is the deepest node of a
pinned path and pinning walks to the root, so ``lock_ref(node) = pins held at node + sum of the
children's lock_ref``. A match that ends inside an edge splits the node first (SGLang's
``_split_node``), so a pin always covers whole nodes.

Eviction: least-recently-used leaves with ``lock_ref == 0``, from a heap (SGLang ``evict``). kvbench
trims a leaf from its tail one block at a time instead of dropping it whole, so capacity is managed
per block, like the hash cache, and a parent is only ever evicted after its children: the radix
equivalent of tail-first release. Because only leaves are evicted, head-first release cannot exist
here: ``CacheConfig`` refuses it for the radix kind.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Sequence
from typing import Any

from kvbench.cache.base import (
    CacheConfig,
    CacheStats,
    Clock,
    InsertResult,
    MatchResult,
    insert_range,
)
from kvbench.cache.block_hash import PromptBlocks
from kvbench.errors import CacheBusyError


class RadixNode:
    """A run of consecutive blocks. ``blocks`` holds each block's token bytes."""

    __slots__ = ("parent", "children", "blocks", "payloads", "lock_ref", "last_tick", "last_used_s")

    def __init__(self, parent: RadixNode | None, blocks: list[bytes], payloads: list[Any]) -> None:
        self.parent = parent
        self.children: dict[bytes, RadixNode] = {}
        self.blocks = blocks
        self.payloads = payloads
        self.lock_ref = 0
        self.last_tick = 0  # logical LRU clock: larger = used more recently
        self.last_used_s = 0.0

    def __repr__(self) -> str:
        return f"RadixNode(blocks={len(self.blocks)}, lock_ref={self.lock_ref})"


def _payloads_of(handles: list[RadixNode], num_hit_blocks: int) -> list[Any]:
    if not handles:
        return []
    runs = []
    node = handles[0]
    while node.parent is not None:
        runs.append(node.payloads)
        node = node.parent
    return [payload for run in reversed(runs) for payload in run]


class RadixPrefixCache:
    """Radix tree over block token bytes with lock refs, LRU leaf eviction and an optional TTL."""

    def __init__(self, config: CacheConfig, clock: Clock | None = None) -> None:
        if config.verify_tokens:
            raise ValueError("the radix cache always compares tokens; verify_tokens is for 'hash'")
        self.config = config
        self.stats = CacheStats(block_size=config.block_size)
        self._clock = clock or time.monotonic
        self._roots: dict[bytes, RadixNode] = {}
        self._num_blocks = 0
        self._num_pinned_blocks = 0
        self._ticks = itertools.count(1)
        self._heap: list[tuple[int, int, RadixNode]] = []  # (last_tick, seq, leaf), lazily pruned
        self._heap_seq = itertools.count()  # tie-breaker: heap entries never compare nodes
        self._pins: dict[int, int] = {}  # id(node) -> handles outstanding there (for invariants)

    @property
    def num_cached_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_evictable_blocks(self) -> int:
        return self._num_blocks - self._num_pinned_blocks

    # -- tree walking ----------------------------------------------------------------------------

    def _root(self, namespace: bytes) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = RadixNode(None, [], [])
            root.lock_ref = 1  # roots are never evicted
        return root

    def _walk(self, prompt: PromptBlocks, limit: int) -> tuple[RadixNode, int]:
        """Deepest node matching the first ``limit`` blocks (splitting mid-edge); blocks matched."""
        blocks = prompt.block_tokens
        if blocks is None:
            raise ValueError("the radix cache needs prompts built with their token bytes")
        node = self._root(prompt.namespace)
        matched = 0
        while matched < limit:
            child = node.children.get(blocks[matched])
            if child is None:
                break
            edge = child.blocks
            run = 1
            while run < len(edge) and matched + run < limit and edge[run] == blocks[matched + run]:
                run += 1
            matched += run
            if run < len(edge):
                child = self._split(child, run)
                node = child
                break
            node = child
        return node, matched

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut ``node`` after ``at`` blocks; returns the new upper node (the lower keeps ``node``)."""
        upper = RadixNode(node.parent, node.blocks[:at], node.payloads[:at])
        upper.lock_ref = node.lock_ref
        upper.last_tick, upper.last_used_s = node.last_tick, node.last_used_s
        node.parent.children[node.blocks[0]] = upper
        node.blocks, node.payloads = node.blocks[at:], node.payloads[at:]
        node.parent = upper
        upper.children[node.blocks[0]] = node
        return upper

    def _pin(self, node: RadixNode, tick: int, now: float) -> None:
        self._pins[id(node)] = self._pins.get(id(node), 0) + 1
        while node.parent is not None:
            if node.lock_ref == 0:
                self._num_pinned_blocks += len(node.blocks)
            node.lock_ref += 1
            node.last_tick, node.last_used_s = tick, now
            node = node.parent

    def _unpin_handle(self, node: RadixNode) -> None:
        count = self._pins.get(id(node), 0)
        if count <= 0:
            raise ValueError(f"{node!r} released more often than it was pinned")
        if count == 1:
            del self._pins[id(node)]
        else:
            self._pins[id(node)] = count - 1

    # -- protocol --------------------------------------------------------------------------------

    def lookup(self, prompt: PromptBlocks, max_hit_blocks: int | None = None) -> MatchResult:
        """Longest cached prefix of ``prompt`` (token-exact), at most ``max_hit_blocks``, pinned."""
        now = self._clock()
        expired = self._sweep(now) if self.config.ttl_s is not None else 0
        limit = prompt.num_full_blocks
        if max_hit_blocks is not None:
            limit = min(limit, max(max_hit_blocks, 0))
        node, matched = self._walk(prompt, limit)
        handles = []
        if matched:
            self._pin(node, next(self._ticks), now)
            handles.append(node)
        stats = self.stats
        stats.num_lookups += 1
        stats.num_queried_blocks += limit
        stats.num_hit_blocks += matched
        return MatchResult(matched, handles, _payloads_of, expired)

    def insert(
        self,
        prompt: PromptBlocks,
        start_block: int,
        payloads: Sequence[Any] | None = None,
        stop_block: int | None = None,
    ) -> InsertResult:
        """Store blocks ``start_block .. stop_block`` of ``prompt`` as a new leaf, pinned.

        Blocks that another request stored meanwhile are shared, not stored twice; what does not
        fit after evicting every unpinned leaf is refused.
        """
        start, stop = insert_range(prompt, start_block, payloads, stop_block)
        now, tick = self._clock(), next(self._ticks)
        node, matched = self._walk(prompt, stop)
        if matched < start:
            raise ValueError(
                f"blocks before start_block {start} must be cached (the caller's pinned hit); "
                f"only {matched} are"
            )
        self._pin(node, tick, now)  # protect the path from the evictions below
        wanted = stop - matched
        room = self.config.capacity_blocks - self._num_blocks
        freed = self._evict(wanted - room) if wanted > room else 0
        self.stats.num_evicted_blocks += freed
        room += freed
        num_new = min(wanted, room)
        if num_new:
            offset = matched - start
            leaf = RadixNode(
                node,
                list(prompt.block_tokens[matched : matched + num_new]),
                list(payloads[offset : offset + num_new]) if payloads is not None else [None] * num_new,
            )
            node.children[leaf.blocks[0]] = leaf
            self._unpin_handle(node)  # move the pin from the path's end to the new leaf
            self._pins[id(leaf)] = 1
            leaf.lock_ref = 1
            leaf.last_tick, leaf.last_used_s = tick, now
            self._num_blocks += num_new
            self._num_pinned_blocks += num_new
            node = leaf
        self.stats.num_inserted_blocks += num_new
        self.stats.num_refused_blocks += wanted - num_new
        return InsertResult(num_new, matched - start, wanted - num_new, [node], freed)

    def release(self, handles: Sequence[RadixNode]) -> None:
        """Unpin each handle's path; nodes reaching ``lock_ref`` 0 that are leaves become evictable.

        Raises:
            ValueError: a handle released more often than it was pinned.
        """
        now, tick = self._clock(), next(self._ticks)
        for handle in handles:
            self._unpin_handle(handle)
            node = handle
            while node.parent is not None:
                node.lock_ref -= 1
                node.last_tick, node.last_used_s = tick, now
                if node.lock_ref == 0:
                    self._num_pinned_blocks -= len(node.blocks)
                    if not node.children:
                        heapq.heappush(self._heap, (tick, next(self._heap_seq), node))
                node = node.parent

    def _pop_evictable_leaf(self) -> RadixNode | None:
        """Least recently used unpinned leaf, skipping stale heap entries; ``None`` if none."""
        heap = self._heap
        while heap:
            tick, _, node = heap[0]
            if node.last_tick == tick and node.lock_ref == 0 and not node.children and node.blocks:
                return node
            heapq.heappop(heap)
        return None

    def _evict(self, num_blocks: int, expire_before_s: float | None = None) -> int:
        """Trim LRU unpinned leaves from their tails until ``num_blocks`` are freed (or, with
        ``expire_before_s``, drop whole leaves idle since before that time); returns blocks freed."""
        freed = 0
        while freed < num_blocks:
            leaf = self._pop_evictable_leaf()
            if leaf is None or (expire_before_s is not None and leaf.last_used_s >= expire_before_s):
                break
            key = leaf.blocks[0]
            take = min(len(leaf.blocks), num_blocks - freed)
            del leaf.blocks[len(leaf.blocks) - take :]
            del leaf.payloads[len(leaf.payloads) - take :]
            freed += take
            if leaf.blocks:
                continue  # still the least recently used leaf; its heap entry stays valid
            heapq.heappop(self._heap)
            parent = leaf.parent
            del parent.children[key]
            leaf.parent = None
            if parent.parent is not None and parent.lock_ref == 0 and not parent.children:
                heapq.heappush(self._heap, (parent.last_tick, next(self._heap_seq), parent))
        self._num_blocks -= freed
        return freed

    def sweep(self) -> int:
        """Drop unpinned blocks idle for longer than the TTL now; returns how many."""
        return self._sweep(self._clock()) if self.config.ttl_s is not None else 0

    def _sweep(self, now: float) -> int:
        freed = self._evict(self._num_blocks, expire_before_s=now - self.config.ttl_s)
        self.stats.num_expired_blocks += freed
        return freed

    def reset(self) -> None:
        """Drop every block. Raises ``CacheBusyError`` while any block is pinned."""
        if self._num_pinned_blocks:
            raise CacheBusyError(f"cannot reset: {self._num_pinned_blocks} blocks are pinned")
        self._roots.clear()
        self._heap.clear()
        self._num_blocks = 0

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if sizes, lock refs, links or the evictable heap disagree."""
        total = pinned = 0
        live_heap = {id(node) for tick, _, node in self._heap if node.last_tick == tick}
        for root in self._roots.values():
            stack = [root]
            while stack:
                node = stack.pop()
                children_refs = 0
                for key, child in node.children.items():
                    if child.parent is not node or not child.blocks or child.blocks[0] != key:
                        raise AssertionError(f"{child!r} is linked wrongly under its parent")
                    children_refs += child.lock_ref
                    stack.append(child)
                if node.parent is None:
                    continue
                if len(node.payloads) != len(node.blocks):
                    raise AssertionError(f"{node!r}: payloads and blocks differ in length")
                if node.lock_ref != self._pins.get(id(node), 0) + children_refs:
                    raise AssertionError(f"{node!r}: lock_ref disagrees with the pins below it")
                total += len(node.blocks)
                pinned += len(node.blocks) if node.lock_ref else 0
                if not node.lock_ref and not node.children and id(node) not in live_heap:
                    raise AssertionError(f"evictable leaf {node!r} is missing from the heap")
        if total != self._num_blocks or pinned != self._num_pinned_blocks:
            raise AssertionError(
                f"counted {total}/{pinned} blocks, recorded {self._num_blocks}/{self._num_pinned_blocks}"
            )
        if total > self.config.capacity_blocks:
            raise AssertionError(f"{total} blocks held, capacity {self.config.capacity_blocks}")
