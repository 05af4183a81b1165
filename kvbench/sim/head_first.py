"""Head-first release in one pass per truncation: exact LRU results without a replay per size.

Head-first release (kept only to demonstrate the bug) puts a request's blocks on the free list
``k_0`` first, so ``k_0`` ends the *oldest* of them and the tail the newest. Why the replay
(:func:`kvbench.sim.replay.simulate`, hash cache, no TTL, full-width keys, concurrency 1) is still
plain LRU over a fixed sequence, per request with full-block keys ``k_0 .. k_{n-1}`` at capacity
``C``:

1. *Access order.* Lookup pins the hits ``k_0 .. k_{h-1}``, insert then touches ``k_h ..`` in
   order, and release goes head first, so the request's accesses, oldest first, are ``k_0, k_1, ..``.
2. *Pinned blocks are the most recent.* While the request runs, the keys it has touched are pinned
   and are exactly the most recently used ones; so when ``n <= C`` an insert that evicts "the least
   recently used unpinned block" evicts the least recently used block, as LRU does. That victim may
   be a later key of the same request (an orphaned tail ``k_{j+1}`` left after ``k_j`` was evicted:
   head-first leaves those), which LRU does too: the key then misses when the request reaches it.
   Lookup hits do not change the cache, so block ``j`` hits iff ``j < m`` (the last-token cap) and
   every access ``k_0 .. k_j`` is an LRU hit: the prefix-max stack distance is ``<= C``.
3. *Refused inserts.* When ``n > C`` the cache is full of the request's own ``k_0 .. k_{C-1}`` at
   ``k_C``, and the rest is refused: the replay at ``C`` is LRU over the request cut to its first
   ``C`` blocks. That sequence depends on ``C`` (tail-first keeps the top ``C`` of one stack instead,
   :mod:`kvbench.sim.stack_distance`), so one pass is exact for every ``C >= max n`` at once, and
   each smaller ``C`` takes its own pass over the trace cut to ``C`` blocks per request.

The pass: a block last used at time ``t`` has distance ``U - t + superseded(< t)`` before the
request (as in :mod:`kvbench.sim.stack_distance`, whose Fenwick tree with range updates this reuses),
plus the earlier keys of this request last used *below* ``t`` (they moved above it). A request's warm
keys usually come in runs last used at consecutive, ascending times (head first), so a run costs one
tree query and one bisect, and its other keys step in O(1).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from kvbench.cache.base import ReleaseOrder
from kvbench.sim.curve import HitCurve
from kvbench.sim.replay import PreparedTrace, SimResult
from kvbench.sim.stack_distance import COLD, RangeFenwickTree, StackDistances, one_pass


def head_first_results(trace: PreparedTrace, capacities_blocks: list[int]) -> list[SimResult]:
    """What :func:`~kvbench.sim.replay.simulate` returns with head-first release at each capacity
    (every counter and every request's cached tokens), in the order given: one pass for all
    capacities of at least the longest request's full blocks, one per smaller capacity.

    Raises:
        ValueError: a capacity is not positive.
    """
    longest = max((prompt.num_full_blocks for prompt in trace.prompts), default=0)
    curves: dict[int | None, HitCurve] = {}
    results = []
    for capacity in capacities_blocks:
        if capacity <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity}")
        cut = None if capacity >= longest else capacity
        if cut not in curves:
            curves[cut] = head_first_curve(trace, cut)
        results.append(curves[cut].result_at(capacity))
    return results


def head_first_curve(trace: PreparedTrace, cut_blocks: int | None = None) -> HitCurve:
    """The head-first distances of ``trace`` with every request cut to its first ``cut_blocks``
    blocks (``None``: uncut). Its results are exact at capacity ``cut_blocks`` only, or, uncut, at
    every capacity of at least the longest request's full blocks (module docstring, point 3)."""
    key_lists = [
        prompt.block_hashes if cut_blocks is None else prompt.block_hashes[:cut_blocks]
        for prompt in trace.prompts
    ]
    hits, touches, cut_offsets, num_distinct = head_first_distances(key_lists)
    counts = np.fromiter((p.num_full_blocks for p in trace.prompts), dtype=np.int64, count=len(trace.prompts))
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if cut_blocks is not None:  # the blocks past the cut were refused: never cached, never touched
        hits, touches = _uncut(hits, cut_offsets, offsets), _uncut(touches, cut_offsets, offsets)
    caps = np.fromiter((p.max_hit_blocks for p in trace.prompts), dtype=np.int64, count=counts.size)
    return HitCurve(
        trace,
        StackDistances(hits, offsets, caps, num_distinct),
        release_order=ReleaseOrder.HEAD_FIRST,
        touch_distances=touches,
    )


def _uncut(values: np.ndarray, cut_offsets: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-block values of the cut requests spread to the full requests' slots, :data:`COLD` past the cut."""
    full = np.full(int(offsets[-1]), COLD, dtype=np.int64)
    lengths = np.diff(cut_offsets)
    positions = np.arange(values.size, dtype=np.int64) - np.repeat(cut_offsets[:-1], lengths)
    full[np.repeat(offsets[:-1], lengths) + positions] = values
    return full


def head_first_distances(
    key_lists: list[tuple[bytes, ...]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Stack distances of each request's keys accessed ``k_0`` first (head-first release), each taken
    at its own access: ``(prefix_max, distances, offsets, num_distinct_keys)``; the first two are
    int64 of shape (num_blocks,), :data:`COLD` for a key never seen before, ``offsets`` as in
    :class:`~kvbench.sim.stack_distance.StackDistances`. O(T log T) for T keys in all."""
    distances, offsets, num_distinct = one_pass(key_lists, _warm_distances, head_first=True)
    prefix_max = distances.copy()
    for start, stop in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        if stop > start and prefix_max[start] != COLD:  # a cold first key: the whole request is cold
            np.maximum.accumulate(prefix_max[start:stop], out=prefix_max[start:stop])
    return prefix_max, distances, offsets, num_distinct


def _warm_distances(
    keys, last_access: dict[bytes, int], superseded: RangeFenwickTree, flags: bytearray
) -> tuple[list[int], list[tuple[int, int]]]:
    """Distances of a request's leading warm keys at their accesses, and the runs of consecutive
    ascending times ``(first, last)`` at which those keys were last used."""
    distances: list[int] = []
    runs: list[tuple[int, int]] = []
    touched: list[int] = []  # sorted last-use times of this request's earlier runs
    num_live, previous, before, run_first, moved = len(last_access), -2, 0, -1, 0
    for key in keys:
        seen = last_access.get(key)
        if seen is None:
            break  # a cold key: by the chain property every later one is cold too
        if seen == previous + 1:  # the run goes on one slot higher; the key before it moved above
            before += flags[previous]
            moved += 1
        else:
            if run_first >= 0:
                _close_run(runs, touched, run_first, previous)
            run_first = seen
            before, moved = superseded.prefix_sum(seen - 1), bisect_left(touched, seen)
        previous = seen
        distances.append(num_live - seen + before + moved)
    if run_first >= 0:
        runs.append((run_first, previous))
    return distances, runs


def _close_run(runs: list[tuple[int, int]], touched: list[int], first: int, last: int) -> None:
    runs.append((first, last))
    position = bisect_left(touched, first)
    touched[position:position] = range(first, last + 1)
