"""The one-pass LRU stack distances of :mod:`kvbench.sim.stack_distance`, vectorized over numpy
arrays of integer keys: the exact curve of traces of real size (24.8M block accesses
took 190 s and 4.2 GB in the per-key pass over bytes keys).

The same numbers, computed in another order. With every request's keys used tail first at the
time slots ``offsets[r] .. offsets[r + 1] - 1`` (``k_{n-1}`` first), a warm key last used at slot
``p`` has, before request ``r`` runs, the distance ``U_r - p + s_r(p)``: ``U_r`` distinct keys
before ``r``, ``s_r(p)`` slots below ``p`` superseded by requests before ``r``
(:mod:`kvbench.sim.stack_distance`'s ``num_live - seen + before``). A request's warm keys come in
*runs* whose last uses were consecutive slots (one earlier request's keys); within a run the
distance rises by one a key. So only each run's first key needs ``s_r(p)``, and each run
supersedes one range of slots: ``s_r(p)`` is a sum over the runs of earlier requests, a
two-dimensional dominance count (earlier request, lower slot) answered offline for all runs at once
by divide and conquer over request numbers (:func:`earlier_sums`: one sort per level, log2(requests)
levels). Cost: one sort of the accesses (by key) and one sort of the runs per level, O(R log^2 R)
for R runs; memory: a few int32 / int64 arrays of the accesses' length.
"""

from __future__ import annotations

import numpy as np

from kvbench.sim.stack_distance import COLD


def earlier_sums(
    times_u: np.ndarray, values_u: np.ndarray, signs_u: np.ndarray, times_q: np.ndarray, values_q: np.ndarray
) -> np.ndarray:
    """For each query ``q``: the sum over updates ``u`` with ``times_u < times_q`` and ``values_u <
    values_q`` of ``signs_u * (values_u - values_q)``; int64, shape of ``times_q``. Times and values
    are non-negative integers (int64 arrays)."""
    result = np.zeros(times_q.size, dtype=np.int64)
    if not times_u.size or not times_q.size:
        return result
    span = int(max(values_u.max(), values_q.max())) + 1
    num_levels = max(int(max(times_u.max(), times_q.max())).bit_length(), 1)
    for shift in range(num_levels - 1, -1, -1):  # pairs of halves of 2**(shift + 1) request numbers
        left = ((times_u >> shift) & 1) == 0
        right = np.flatnonzero((times_q >> shift) & 1)
        if not right.size or not left.any():
            continue
        keys = (times_u[left] >> (shift + 1)) * span + values_u[left]
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        signs = signs_u[left][order]
        count = np.concatenate([[0], np.cumsum(signs)])
        weighted = np.concatenate([[0], np.cumsum(signs * values_u[left][order])])
        pair = (times_q[right] >> (shift + 1)) * span
        below = np.searchsorted(keys, pair + values_q[right], side="left")
        start = np.searchsorted(keys, pair, side="left")
        result[right] += (weighted[below] - weighted[start]) - values_q[right] * (count[below] - count[start])
    return result


def _index_dtype(size: int):
    return np.int32 if size < 2**31 else np.int64


def _warm_counts(warm: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Warm accesses per request; int64, shape (num_requests,). By differences of one running count, so
    a request without keys counts 0 wherever it is (``np.add.reduceat`` with offsets clamped to the
    last access cut the last non-empty request short when empty requests followed it)."""
    running = np.concatenate([[0], np.cumsum(warm, dtype=np.int64)])
    return running[offsets[1:]] - running[offsets[:-1]]


def previous_slots(keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """For each access (chain order, flat), the slot of its key's previous access, -1 for a first
    access; int32 (int64 past 2**31 accesses). A key is used at most once a request, so its uses in
    chain order (a stable sort of the keys) are its uses in slot order."""
    index = _index_dtype(keys.size)
    order = np.argsort(keys, kind="stable").astype(index)
    same = keys[order[1:]] == keys[order[:-1]]
    previous = np.full(keys.size, -1, dtype=index)
    previous[order[1:][same]] = order[:-1][same]  # the position of the key's previous use
    del order, same
    slots = np.repeat((offsets[:-1] + offsets[1:] - 1).astype(index), np.diff(offsets))
    slots -= np.arange(keys.size, dtype=index)  # tail first: k_{n-1} at offsets[r], k_0 last
    warm = previous >= 0
    previous[warm] = slots[previous[warm]]
    return previous


def _runs(previous: np.ndarray, offsets: np.ndarray):
    """The runs of warm keys: ``(head positions, previous slot at the head, request, length)``, and
    the warm count of each request. Raises ``ValueError`` when the warm keys of a request are not a
    leading run (the keys are not chain keys)."""
    warm = previous >= 0
    start = np.zeros(previous.size, dtype=bool)
    start[offsets[:-1][offsets[:-1] < previous.size]] = True
    if np.any(warm[1:] & ~warm[:-1] & ~start[1:]):
        raise ValueError("a warm key after a cold one: the keys do not name their prefixes")
    head = warm.copy()
    head[1:] &= start[1:] | (previous[1:] != previous[:-1] - 1)
    del start
    num_warm = _warm_counts(warm, offsets)
    del warm
    heads = np.flatnonzero(head)
    del head
    run_requests = np.searchsorted(offsets, heads, side="right") - 1
    # the warm segment's end, unless the next run starts before
    ends = offsets[run_requests] + num_warm[run_requests]
    following = np.append(heads[1:], previous.size)
    lengths = np.minimum(ends, following) - heads
    return heads, previous[heads].astype(np.int64), run_requests, lengths, num_warm


def compact_distances(keys: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`kvbench.sim.stack_distance.distances_of` for integer chain keys, vectorized.

    Args:
        keys: int32 / int64, shape (num_accesses,): every request's keys in chain order, flat
            (equal keys: equal blocks; a key names its whole prefix).
        offsets: int64, shape (num_requests + 1,): request ``r``'s keys are ``keys[offsets[r]:offsets[r +
        1]]``.

    Returns:
        ``(distances, num_distinct_keys)``: int64 distances as
        :class:`~kvbench.sim.stack_distance.StackDistances`
        holds them (prefix-max, :data:`~kvbench.sim.stack_distance.COLD` past the warm keys).

    Raises:
        ValueError: a request's warm keys are not a leading run.
    """
    return distances_after(previous_slots(keys, offsets), offsets, 0)


def distances_after(
    previous: np.ndarray, offsets: np.ndarray, num_live_before: int
) -> tuple[np.ndarray, int]:
    """The distances of requests whose keys' previous slots are ``previous`` (as
    :func:`previous_slots` gives them, -1: cold), after ``num_live_before`` keys used once each at
    slots ``0 .. num_live_before - 1`` (none superseded: the recency order of the keys seen before,
    oldest first) and with the requests' own slots counted from ``num_live_before``.
    ``(distances, num_distinct_keys)`` as :func:`compact_distances`, the keys before included; what
    :mod:`kvbench.sim.streamed_curve` runs on each chunk of a trace."""
    counts, num_accesses = np.diff(offsets), previous.size
    heads, seen, run_requests, lengths, num_warm = _runs(previous, offsets)
    del previous  # the last reference when the caller passed it on
    # cold accesses are first uses
    distinct_before = num_live_before + np.concatenate([[0], np.cumsum(counts - num_warm)])
    superseded = earlier_sums(
        np.repeat(run_requests, 2),
        np.stack([seen + 1, seen - lengths + 1], axis=1).ravel(),
        np.tile(np.array([1, -1], dtype=np.int64), heads.size),
        run_requests,
        seen,
    )
    head_distances = distinct_before[run_requests] - seen + superseded
    return _filled(num_accesses, heads, head_distances, run_requests, lengths), int(distinct_before[-1])


def _filled(
    num_accesses: int,
    heads: np.ndarray,
    head_distances: np.ndarray,
    run_requests: np.ndarray,
    lengths: np.ndarray,
    chunk_runs: int = 1 << 18,
) -> np.ndarray:
    """The distances array: a run's keys at ``head + k`` have ``head_distances + k``, the prefix max
    within a request carried over from the request's earlier runs; COLD elsewhere."""
    ends = head_distances + lengths - 1  # each run's largest distance
    span = int(ends.max(initial=0)) + 2  # above every distance, so that requests do not mix
    # running max in the request
    shifted = np.maximum.accumulate(ends + run_requests * span) - run_requests * span
    carry = np.zeros_like(ends)
    same = run_requests[1:] == run_requests[:-1]
    carry[1:][same] = shifted[:-1][same]
    distances = np.full(num_accesses, COLD, dtype=np.int64)
    for first in range(0, heads.size, chunk_runs):
        part = slice(first, first + chunk_runs)
        within = np.arange(int(lengths[part].sum()), dtype=np.int64) - np.repeat(
            np.cumsum(lengths[part]) - lengths[part], lengths[part]
        )
        positions = np.repeat(heads[part], lengths[part]) + within
        distances[positions] = np.maximum(
            np.repeat(head_distances[part], lengths[part]) + within, np.repeat(carry[part], lengths[part])
        )
    return distances
