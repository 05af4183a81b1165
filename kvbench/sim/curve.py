"""The exact hit-rate curve of the LRU hash cache at every capacity, from one pass of stack distances.

:func:`hit_curve` runs :func:`kvbench.sim.stack_distance.stack_distances` once; :class:`HitCurve`
then answers any capacity ``C`` with the same :class:`~kvbench.sim.replay.SimResult` that
:func:`~kvbench.sim.replay.simulate` gives at ``C`` (every counter and every request's cached
tokens; ``tests/sim/test_curve.py`` checks this on random traces), using, per request with ``n``
full blocks and cap ``m``, and ``U`` distinct keys in the trace:

* hits: the leading blocks among the first ``m`` whose (prefix-max) distance is ``<= C``;
* cached before the request: the leading blocks among all ``n`` with distance ``<= C``;
* refused: ``max(0, n - C)``; inserted: ``min(n, C)`` minus the cached ones;
* evicted: inserted in all minus the blocks held at the end, ``min(C, U)`` (nothing expires).

Head-first release has its own passes (:mod:`kvbench.sim.head_first`: its access sequence depends
on the capacity below the longest request). Where no pass applies (:func:`one_pass_refusal` says
why) the caller replays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kvbench.cache.base import CacheConfig, CacheKind, ReleaseOrder
from kvbench.sim.replay import PreparedTrace, SimResult
from kvbench.sim.stack_distance import COLD, StackDistances, stack_distances


def one_pass_refusal(config: CacheConfig) -> str | None:
    """Why the one pass would differ from the replay under ``config``, or ``None`` if it is exact
    (the conditions are derived in :mod:`kvbench.sim.stack_distance` for tail-first release and in
    :mod:`kvbench.sim.head_first` for head-first release). Capacity is ignored."""
    if config.kind is not CacheKind.HASH:
        return "the radix cache splits nodes at token granularity (not a block-key LRU)"
    if config.ttl_s is not None:
        return "a TTL expires blocks independently of capacity"
    if config.hash.hash_bits is not None or config.verify_tokens:
        return "truncated or verified keys can collide, which breaks the chain property"
    return None


@dataclass(frozen=True, eq=False)
class HitCurve:
    """Hit counts of one trace at every capacity (hash cache, tail-first, no TTL, concurrency 1).

    Attributes:
        trace: the hashed trace.
        distances: prefix-max stack distances (they decide the hits).
        release_order: tail-first (:func:`hit_curve`: exact at every capacity) or head-first
            (:mod:`kvbench.sim.head_first`: exact only at the capacities that module names).
        touch_distances: int64, shape (num_blocks,): each block's own distance when the request
            touches it, which decides whether it was held or inserted; ``None``: ``distances``
            (tail-first, where the held blocks of a prompt are a leading run).
    """

    trace: PreparedTrace
    distances: StackDistances
    release_order: ReleaseOrder = ReleaseOrder.TAIL_FIRST
    touch_distances: np.ndarray | None = None

    @cached_property
    def hit_distances(self) -> np.ndarray:
        """Sorted distances of the blocks the cap lets hit (cold ones excluded); int64."""
        distances = self.distances.distances[self._hit_mask]
        distances = distances[distances != COLD]
        distances.sort()  # in place: one copy of the trace's distances at a time
        return distances

    @cached_property
    def _hit_mask(self) -> np.ndarray:
        return self.distances.hit_mask()

    @cached_property
    def num_prompt_tokens(self) -> int:
        return self.trace.num_prompt_tokens

    @cached_property
    def num_queried_blocks(self) -> int:
        """Blocks the last-token cap lets lookups hit, over the trace (the same at every capacity)."""
        return int(self.distances.max_hit_blocks.sum())

    @cached_property
    def _sorted_distances(self) -> np.ndarray:
        """Sorted touch distances of the blocks that were ever seen (a cold block is held at no
        capacity, so leaving the COLD ones out changes no count and saves their memory)."""
        touched = self.distances.distances if self.touch_distances is None else self.touch_distances
        warm = touched[touched != COLD]
        warm.sort()
        return warm

    @cached_property
    def _sorted_num_full_blocks(self) -> np.ndarray:
        return np.sort(self.distances.num_full_blocks)

    @property
    def num_blocks(self) -> int:
        """Full blocks over the trace (a capacity that holds them all is unbounded)."""
        return int(self.distances.offsets[-1])

    @property
    def ideal_capacity_blocks(self) -> int:
        """The smallest capacity that reaches the unbounded cache's hit count (1 if nothing hits)."""
        hits = self.hit_distances
        return int(hits[-1]) if hits.size else 1

    def change_points(self) -> np.ndarray:
        """Every capacity (blocks, ascending) at which the hit count rises, plus 1; int64."""
        return np.union1d(np.array([1], dtype=np.int64), self.hit_distances)

    def totals(self, capacities_blocks: np.ndarray) -> dict[str, np.ndarray]:
        """Trace-wide counters at each capacity (blocks), vectorized: ``num_hit_blocks``,
        ``num_inserted_blocks``, ``num_refused_blocks``, ``num_evicted_blocks``; int64 arrays of
        the shape of ``capacities_blocks``."""
        capacities = np.asarray(capacities_blocks, dtype=np.int64)
        all_distances = self._sorted_distances
        hits = np.searchsorted(self.hit_distances, capacities, side="right")
        cached_before = np.searchsorted(all_distances, capacities, side="right")  # held when touched
        blocks = self._sorted_num_full_blocks
        below = np.searchsorted(blocks, capacities, side="right")  # requests with n <= C
        blocks_below = np.concatenate([[0], np.cumsum(blocks)])[below]
        num_above = blocks.size - below
        num_blocks = int(blocks.sum())
        stored = blocks_below + num_above * capacities  # sum over requests of min(n, C)
        refused = (num_blocks - blocks_below) - num_above * capacities
        inserted = stored - cached_before
        evicted = inserted - np.minimum(capacities, self.distances.num_distinct_blocks)
        return {
            "num_hit_blocks": hits,
            "num_inserted_blocks": inserted,
            "num_refused_blocks": refused,
            "num_evicted_blocks": evicted,
        }

    def result_at(self, capacity_blocks: int) -> SimResult:
        """What :func:`~kvbench.sim.replay.simulate` returns at ``capacity_blocks``, every request's
        cached tokens included.

        Raises:
            ValueError: ``capacity_blocks`` is not positive.
        """
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        offsets = self.distances.offsets
        hit = self._hit_mask & (self.distances.distances <= capacity_blocks)
        per_request = np.add.reduceat(np.append(hit, False), offsets[:-1], dtype=np.int64)
        per_request[offsets[:-1] == offsets[1:]] = 0  # reduceat gives the next element for an empty run
        return self._result(
            capacity_blocks, self.totals(np.array([capacity_blocks])), 0, per_request * self.trace.block_size
        )

    def results(self, capacities_blocks: np.ndarray | None = None) -> list[SimResult]:
        """Results at each capacity (default: :meth:`change_points`), vectorized over capacities;
        ``cached_tokens_per_request`` is left empty (use :meth:`result_at` for it)."""
        capacities = self.change_points() if capacities_blocks is None else np.asarray(capacities_blocks)
        totals = self.totals(capacities)
        empty = np.zeros(0, dtype=np.int64)
        return [
            self._result(int(capacity), totals, i, empty) for i, capacity in enumerate(capacities.tolist())
        ]

    def _result(self, capacity: int, totals: dict[str, np.ndarray], i: int, cached: np.ndarray) -> SimResult:
        return one_pass_result(self, capacity, totals, i, cached)


def one_pass_result(
    curve, capacity: int, totals: dict[str, np.ndarray], i: int, cached: np.ndarray
) -> SimResult:
    """The :class:`SimResult` at ``capacity`` blocks of a one-pass curve (``curve``: a
    :class:`HitCurve` or a streamed one: its ``trace``, ``release_order``, prompt-token and
    queried-block counts), from column ``i`` of ``totals``; ``cached``: tokens per request (may be
    empty)."""
    return SimResult(
        capacity_blocks=capacity,
        release_order=curve.release_order.value,
        cache_kind=CacheKind.HASH.value,
        block_size=curve.trace.block_size,
        ttl_s=None,
        num_requests=curve.trace.num_requests,
        num_prompt_tokens=curve.num_prompt_tokens,
        num_cached_tokens=int(totals["num_hit_blocks"][i]) * curve.trace.block_size,
        num_queried_blocks=curve.num_queried_blocks,
        num_expired_blocks=0,
        cached_tokens_per_request=cached,
        method="one-pass",
        **{key: int(value[i]) for key, value in totals.items()},
    )


def hit_curve(trace: PreparedTrace) -> HitCurve:
    """One pass over ``trace`` (hashed for the hash cache); O(T log T) for T full blocks."""
    return HitCurve(trace, stack_distances(trace.prompts))
