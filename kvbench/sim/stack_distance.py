"""LRU stack distances of a trace's block accesses in one pass (Mattson et al., 1970).

LRU is a *stack algorithm*: a cache of ``C`` blocks always holds the ``C`` most recently used
distinct keys, so one pass that records, for every access, the key's position in the recency stack
(its *stack distance*: 1 + distinct keys used since its last use) gives the hit count at every
capacity at once: an access hits at capacity ``C`` iff its distance is ``<= C``.

Why kvbench's replay (:func:`kvbench.sim.replay.simulate`: hash cache, tail-first release, no TTL,
full-width keys, concurrency 1) is exactly that, per request with full-block keys ``k_0 .. k_{n-1}``
and last-token cap ``m = (num_tokens - 1) // block_size``:

1. *Access order.* Every full block is touched (hit or inserted) and released tail first, so the
   request's accesses, oldest first, are ``k_{n-1}, ..., k_0`` (``k_0`` ends most recent).
2. *Chain property.* A key names its whole prefix, so every access of ``k_j`` is followed by one of
   ``k_{j-1}`` in the same request: ``k_{j-1}`` always sits above ``k_j`` in the stack, the cached
   keys of a prompt are a leading run, and the lookup (which stops at the first miss) hits exactly
   the leading keys with distance ``<= C`` among the first ``m``.
3. *Pinned blocks.* While a request runs, its hits are pinned; its inserts evict the least recently
   used unpinned blocks. Those are never keys of the running request (by 2 its cached keys are the
   pinned leading run, except ``k_{n-1}`` when the cap stopped the lookup right before it, and that
   key is the only one inserted then), so the evicted keys are the stack's oldest: the state after
   the request is again the top ``C`` of the stack.
4. *Refused inserts.* An insert is refused only when every held block is pinned by the request,
   i.e. when ``n > C``: the cache then holds ``k_0 .. k_{C-1}``, which is the stack's top ``C`` too,
   and ``n - C`` blocks are refused.

So distances are taken *before* each request's accesses (its own keys are distinct), against the
stack as the previous requests left it. Head-first release (1 reverses within the request and the
refusal rule of 4 then keeps the wrong end) has its own passes in :mod:`kvbench.sim.head_first`.
TTL (an expiry is not a capacity effect), truncated keys (collisions break 2) and the radix cache
(splits at token granularity) are other sequences: :func:`kvbench.sim.curve.one_pass_refusal`
sends those to the replay.

The order-statistics structure is a Fenwick tree over access times. Every time slot holds one
access, and a key's *latest* access is live; the distance of a key last used at time ``t`` is the
number of live accesses at ``>= t``, i.e. ``U - t + superseded(< t)`` for ``U`` distinct keys so
far. So the tree counts only the *superseded* accesses, and a first access costs a dict entry.
Re-accesses come in runs: a request's warm keys were mostly last used together, by one earlier
request, at consecutive times (tail first, so ``k_0`` at the highest). A run costs one O(log T)
range update and one O(log T) query (Fenwick trees with range updates: two trees of
differences); its other keys step down from there in O(1) through a byte per time slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.cache.block_hash import PromptBlocks

COLD = np.iinfo(np.int64).max  # distance of a key never seen before: a miss at every capacity


class FenwickTree:
    """Counts at positions ``0 .. size - 1`` with O(log size) point updates and prefix sums
    (Fenwick, "A new data structure for cumulative frequency tables", 1994)."""

    def __init__(self, size: int) -> None:
        self._tree = [0] * (size + 1)  # 1-based internally
        self.total = 0

    def add(self, position: int, delta: int) -> None:
        tree, index, size = self._tree, position + 1, len(self._tree)
        while index < size:
            tree[index] += delta
            index += index & -index
        self.total += delta

    def prefix_sum(self, position: int) -> int:
        """Sum of the counts at positions ``0 .. position`` (0 for a negative position)."""
        tree, index, total = self._tree, position + 1, 0
        while index > 0:
            total += tree[index]
            index -= index & -index
        return total


class RangeFenwickTree:
    """Counts at positions ``0 .. size - 1`` with O(log size) *range* updates and prefix sums: two
    Fenwick trees over the differences ``d_k`` (``sum_{k<=p} count_k = (p + 1) sum d_k - sum k d_k``)."""

    def __init__(self, size: int) -> None:
        self._differences = FenwickTree(size + 1)
        self._weighted = FenwickTree(size + 1)

    def add_range(self, first: int, last: int, delta: int) -> None:
        """Add ``delta`` to every position ``first .. last`` (inclusive)."""
        self._differences.add(first, delta)
        self._differences.add(last + 1, -delta)
        self._weighted.add(first, delta * first)
        self._weighted.add(last + 1, -delta * (last + 1))

    def prefix_sum(self, position: int) -> int:
        """Sum of the counts at positions ``0 .. position`` (0 for a negative position)."""
        return self._differences.prefix_sum(position) * (position + 1) - self._weighted.prefix_sum(position)


@dataclass(frozen=True, eq=False)
class StackDistances:
    """Per-block stack distances of a trace, flattened in request order.

    Attributes:
        distances: int64, shape (num_blocks,): for full block ``j`` of request ``r`` (at
            ``offsets[r] + j``), the largest stack distance among its blocks ``0 .. j`` before the
            request ran (:data:`COLD` once any of them was never seen). Non-decreasing within a
            request; block ``j`` is cached at capacity ``C`` iff ``distances <= C``.
        offsets: int64, shape (num_requests + 1,): request ``r``'s blocks are ``offsets[r]:offsets[r+1]``.
        max_hit_blocks: int64, shape (num_requests,): the last-token cap of each request.
        num_distinct_blocks: distinct keys in the trace (the stack's final depth).
    """

    distances: np.ndarray
    offsets: np.ndarray
    max_hit_blocks: np.ndarray
    num_distinct_blocks: int

    @property
    def num_full_blocks(self) -> np.ndarray:
        """Full blocks per request; int64, shape (num_requests,)."""
        return np.diff(self.offsets)

    def hit_mask(self) -> np.ndarray:
        """bool, shape (num_blocks,): the blocks the last-token cap lets a lookup hit."""
        num_blocks = self.num_full_blocks
        # each request: its first `hit` blocks, then the rest
        hit = np.minimum(self.max_hit_blocks, num_blocks)
        return np.repeat(
            np.tile(np.array([True, False]), num_blocks.size),
            np.stack([hit, num_blocks - hit], axis=1).ravel(),
        )


def stack_distances(prompts: list[PromptBlocks]) -> StackDistances:
    """One pass over ``prompts`` (arrival order) recording each block's LRU stack distance.

    Cost: O(T log T) for T full blocks in all; memory: the Fenwick tree (T + 1 ints) and one dict
    entry per distinct key.
    """
    distances, offsets, num_distinct = distances_of([p.block_hashes for p in prompts])
    caps = np.fromiter((p.max_hit_blocks for p in prompts), dtype=np.int64, count=len(prompts))
    return StackDistances(distances, offsets, caps, num_distinct)


def distances_of(key_lists: list[tuple[bytes, ...]]) -> tuple[np.ndarray, np.ndarray, int]:
    """The pass itself over each request's keys in chain order (any subset of a prompt's keys that
    keeps their order, e.g. a spatial sample): ``(distances, offsets, num_distinct_keys)`` as in
    :class:`StackDistances`. Distances count only the keys given."""
    return one_pass(key_lists, _warm_distances, head_first=False)


def one_pass(
    key_lists: list[tuple[bytes, ...]], warm_distances, head_first: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """The one pass both release orders share: ``(distances, offsets, num_distinct_keys)``.

    ``warm_distances(keys, last_access, superseded, flags)`` gives a request's leading warm keys'
    distances and the runs ``(first, last)`` of time slots their last uses held (superseded now);
    the request's keys are then used tail first (``k_0`` newest) or, ``head_first``, ``k_0`` first
    (:mod:`kvbench.sim.head_first`). ``distances`` is int64 of shape (num_keys,), :data:`COLD` past
    a request's warm keys."""
    counts = np.fromiter((len(keys) for keys in key_lists), dtype=np.int64, count=len(key_lists))
    offsets = np.zeros(len(key_lists) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    distances = np.full(int(offsets[-1]), COLD, dtype=np.int64)
    superseded = RangeFenwickTree(int(offsets[-1]))  # 1 at every access a later one of its key replaced
    flags = bytearray(int(offsets[-1]))  # the same, one byte per time slot, for O(1) steps in a run
    last_access: dict[bytes, int] = {}
    now = 0
    for index, keys in enumerate(key_lists):
        request_distances, runs = warm_distances(keys, last_access, superseded, flags)
        if request_distances:
            start = int(offsets[index])
            distances[start : start + len(request_distances)] = request_distances
        for first, last in runs:  # the request re-accesses its warm keys: their old accesses are superseded
            superseded.add_range(first, last, 1)
            flags[first : last + 1] = b"\x01" * (last + 1 - first)
        order = keys if head_first else reversed(keys)  # head first: the tail newest; tail first: k_0 newest
        last_access.update(zip(order, range(now, now + len(keys))))
        now += len(keys)
    return distances, offsets, len(last_access)


def _warm_distances(
    keys, last_access: dict[bytes, int], superseded: RangeFenwickTree, flags: bytearray
) -> tuple[list[int], list[tuple[int, int]]]:
    """Prefix-max distances of a request's leading warm keys before it runs, and the runs of
    consecutive times ``(first, last)`` at which those keys were last used."""
    distances: list[int] = []
    runs: list[tuple[int, int]] = []
    num_live, deepest, previous, before, run_last = len(last_access), 0, -2, 0, -1
    for key in keys:
        seen = last_access.get(key)
        if seen is None:
            break  # a cold key: by the chain property every later one is cold too
        if seen == previous - 1:  # the run goes on one slot lower
            before -= flags[seen]
        else:
            if run_last >= 0:
                runs.append((previous, run_last))
            before, run_last = superseded.prefix_sum(seen - 1), seen
        previous = seen
        distance = num_live - seen + before
        if distance > deepest:
            deepest = distance
        distances.append(deepest)
    if run_last >= 0:
        runs.append((previous, run_last))
    return distances, runs
