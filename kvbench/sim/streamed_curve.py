"""The exact curve of a Mooncake / hash-id trace in memory bounded by its distinct blocks.

:func:`streamed_hit_curve` reads the file in chunks of requests
(:func:`~kvbench.workloads.formats.hash_id_columns.hash_id_column_chunks`, :data:`CHUNK_IDS` ids
each) and keeps, between chunks, only the LRU stack itself: the distinct keys in recency order
(:class:`StackState`, a key and a rank each), per-request counts, and the distances as histograms
(one count per distinct distance). Each chunk runs the vectorized pass of
:mod:`kvbench.sim.compact_distances` as if one request had used the keys seen before, once each,
oldest first (:func:`~kvbench.sim.compact_distances.distances_after`): LRU stack distances depend
only on the stack's order when a request starts, so the distances are the whole-trace pass's
(``tests/sim/test_streamed_curve.py`` checks every row against
:func:`~kvbench.sim.compact_curve.compact_hit_curve` on random traces).

Memory: ~12 bytes per distinct key (a rank per key value and the order), ~20 bytes per request,
and one chunk's arrays (~60 bytes per id of the chunk), against ~40 bytes per block access for the
whole-trace pass. Keys are indexed directly by value, so the streamed pass takes traces whose ids
are small integers (Mooncake's count up from 0); a trace whose ids are wider or sparse
(:data:`MAX_KEY_SPACE`), that is not in arrival order, or whose ids do not name their prefixes
gives ``None``, and the caller takes the whole-trace path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from kvbench.cache.base import ReleaseOrder
from kvbench.sim.compact_curve import TraceSize, chain_block_keys, ids_name_prefixes
from kvbench.sim.compact_distances import distances_after
from kvbench.sim.curve import one_pass_result
from kvbench.sim.exact_memory import estimated_ids
from kvbench.sim.replay import SimResult
from kvbench.sim.stack_distance import COLD
from kvbench.workloads.formats.hash_id_columns import HashIdColumns, hash_id_column_chunks
from kvbench.workloads.formats.hash_ids import HASH_ID_FORMATS

CHUNK_IDS = 1 << 22  # ids read per chunk: the chunk's arrays are the pass's largest
MAX_KEY_SPACE = (
    1 << 31
)  # key values above this (or above 8x the accesses read) leave the trace to the other path


_SLICE = 1 << 22  # ranks rewritten per step


def grown(array: np.ndarray, size: int, fill: int) -> np.ndarray:
    """``array``, or a copy of at least ``size`` elements (1/8 more: amortized growth) padded with
    ``fill``."""
    if size <= array.size:
        return array
    bigger = np.full(max(size, array.size + array.size // 8), fill, dtype=array.dtype)
    bigger[: array.size] = array
    return bigger


class StackState:
    """The LRU stack between chunks: every distinct key seen, oldest first (:attr:`order`), and each
    key value's position in it (:attr:`rank`, -1: never seen), both indexed by key value."""

    def __init__(self) -> None:
        self.order = np.zeros(0, dtype=np.int32)  # key values < MAX_KEY_SPACE
        self.rank = np.zeros(0, dtype=np.int32)

    @property
    def num_distinct(self) -> int:
        return int(self.order.size)

    def distances(self, keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """One chunk's distances (as :func:`~kvbench.sim.compact_distances.compact_distances`:
        int64, prefix-max, COLD past the warm keys), against the stack so far; then the stack
        after the chunk. ``keys``: int64 values >= 0, chain keys, in chain order per request."""
        num_before = self.num_distinct
        if not keys.size:
            return np.zeros(0, dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        same = sorted_keys[1:] == sorted_keys[:-1]
        # chunk slots, tail first, after the keys before
        slots = np.repeat(offsets[:-1] + offsets[1:] - 1, np.diff(offsets)) - np.arange(keys.size)
        slots += num_before
        previous = np.full(keys.size, -1, dtype=np.int64)
        previous[order[1:][same]] = slots[order[:-1][same]]  # used before in the chunk
        firsts = order[np.concatenate([[True], ~same])]
        previous[firsts] = self._ranks(keys[firsts])
        lasts = order[np.concatenate([~same, [True]])]
        del order, sorted_keys, same, firsts
        distances, _ = distances_after(previous, offsets, num_before)
        del previous
        self._update(keys[lasts], slots[lasts])
        return distances

    def _ranks(self, keys: np.ndarray) -> np.ndarray:
        ranks = np.full(keys.size, -1, dtype=np.int64)
        known = keys < self.rank.size
        ranks[known] = self.rank[keys[known]]
        return ranks

    def _update(self, touched: np.ndarray, last_slots: np.ndarray) -> None:
        """The keys untouched by the chunk keep their order; the touched ones follow, by last use.
        Ranks are rewritten from the deepest touched key up, a slice at a time (the stack's bottom,
        untouched, keeps its ranks; no temporary of the stack's size but the kept-keys mask)."""
        old = self._ranks(touched)
        old = old[old >= 0]
        first = int(old.min(initial=self.order.size))
        keep = np.ones(self.order.size - first, dtype=bool)
        keep[old - first] = False
        num_kept = first + int(keep.sum())
        order = np.empty(num_kept + touched.size, dtype=np.int32)
        order[:first] = self.order[:first]
        np.compress(keep, self.order[first:], out=order[first:num_kept])
        order[num_kept:] = touched[np.argsort(last_slots)]
        self.order = order
        del keep
        self.rank = grown(self.rank, int(touched.max(initial=-1)) + 1, -1)
        for start in range(first, order.size, _SLICE):
            part = order[start : start + _SLICE]
            self.rank[part] = np.arange(start, start + part.size, dtype=np.int32)


class _Histogram:
    """Counts of non-negative int64 values (distances), one int64 per value up to the largest
    (bounded by the distinct keys), added a chunk at a time; ``values`` / ``counts``: the values
    counted, ascending, and their counts (computed once, after the pass)."""

    def __init__(self) -> None:
        self._dense = np.zeros(0, dtype=np.int32)  # int64 once the counts could pass 2**31 - 1
        self._total = 0

    def add(self, values: np.ndarray) -> None:
        new, counts = np.unique(values, return_counts=True)  # a chunk's worth, not a value's
        self._total += values.size
        if self._total >= 2**31 and self._dense.dtype == np.int32:
            self._dense = self._dense.astype(np.int64)
        self._dense = grown(self._dense, int(new[-1]) + 1 if new.size else 0, 0)
        self._dense[new] += counts.astype(self._dense.dtype)

    @cached_property
    def values(self) -> np.ndarray:
        return np.flatnonzero(self._dense).astype(np.int64)

    @cached_property
    def counts(self) -> np.ndarray:
        return self._dense[self.values].astype(np.int64)

    def at_most(self, capacities: np.ndarray) -> np.ndarray:
        """How many values are ``<= capacities`` (each); int64."""
        cumulative = np.concatenate([[0], np.cumsum(self.counts)])
        return cumulative[np.searchsorted(self.values, capacities, side="right")]


@dataclass(eq=False)
class StreamedCurve:
    """:class:`~kvbench.sim.curve.HitCurve`'s totals (tail-first) from histograms of the distances:
    the same :meth:`totals`, :meth:`results`, :meth:`change_points` and
    :attr:`ideal_capacity_blocks`; no per-request cached tokens (:meth:`results` leaves them empty
    as ``HitCurve.results`` does)."""

    trace: TraceSize
    hit_histogram: _Histogram  # warm distances of the blocks the last-token cap lets hit
    touch_histogram: _Histogram  # every warm distance
    num_full_blocks: np.ndarray  # int32, per request
    num_queried_blocks: int
    num_distinct_blocks: int
    release_order: ReleaseOrder = ReleaseOrder.TAIL_FIRST

    @property
    def num_prompt_tokens(self) -> int:
        return self.trace.num_prompt_tokens

    @property
    def num_blocks(self) -> int:
        """Full blocks over the trace (a capacity that holds them all is unbounded)."""
        return int(self.num_full_blocks.sum(dtype=np.int64))

    @property
    def ideal_capacity_blocks(self) -> int:
        """The smallest capacity that reaches the unbounded cache's hit count (1 if nothing hits)."""
        values = self.hit_histogram.values
        return int(values[-1]) if values.size else 1

    def change_points(self) -> np.ndarray:
        """Every capacity (blocks, ascending) at which the hit count rises, plus 1; int64."""
        return np.union1d(np.array([1], dtype=np.int64), self.hit_histogram.values)

    @cached_property
    def _sorted_num_full_blocks(self) -> np.ndarray:
        return np.sort(self.num_full_blocks.astype(np.int64))

    def totals(self, capacities_blocks: np.ndarray) -> dict[str, np.ndarray]:
        """As :meth:`kvbench.sim.curve.HitCurve.totals` (the same formulas, counted from histograms)."""
        capacities = np.asarray(capacities_blocks, dtype=np.int64)
        hits = self.hit_histogram.at_most(capacities)
        cached_before = self.touch_histogram.at_most(capacities)
        blocks = self._sorted_num_full_blocks
        below = np.searchsorted(blocks, capacities, side="right")
        blocks_below = np.concatenate([[0], np.cumsum(blocks)])[below]
        num_above = blocks.size - below
        stored = blocks_below + num_above * capacities
        refused = (int(blocks.sum()) - blocks_below) - num_above * capacities
        inserted = stored - cached_before
        return {
            "num_hit_blocks": hits,
            "num_inserted_blocks": inserted,
            "num_refused_blocks": refused,
            "num_evicted_blocks": inserted - np.minimum(capacities, self.num_distinct_blocks),
        }

    def results(self, capacities_blocks: np.ndarray | None = None) -> list[SimResult]:
        """Results at each capacity (default: :meth:`change_points`), per-request tokens empty."""
        capacities = self.change_points() if capacities_blocks is None else np.asarray(capacities_blocks)
        totals = self.totals(capacities)
        return [self._result(int(c), totals, i) for i, c in enumerate(capacities.tolist())]

    def _result(self, capacity: int, totals: dict[str, np.ndarray], i: int) -> SimResult:
        return one_pass_result(self, capacity, totals, i, np.zeros(0, dtype=np.int64))


class _Abandoned(Exception):
    """The streamed pass cannot vouch for this trace (the caller takes the whole-trace path)."""


@dataclass
class _Pass:
    """The running state of :func:`streamed_hit_curve`."""

    block_size: int
    block_tokens: int
    stack: StackState = field(default_factory=StackState)
    parents: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))  # -2: unseen id
    hits: _Histogram = field(default_factory=_Histogram)
    touches: _Histogram = field(default_factory=_Histogram)
    blocks: list = field(default_factory=list)  # per-request full blocks, a chunk an array
    expected_ids: int = 0  # the file's ids, estimated before reading (exact_memory.estimated_ids)
    num_ids = num_requests = num_prompt_tokens = num_queried = 0
    last_ms: float = -np.inf

    def add(self, chunk: HashIdColumns) -> None:
        ids, stamps = chunk.hash_ids, chunk.timestamps_ms
        if ids.dtype != np.int32 or (
            stamps.size and (stamps[0] < self.last_ms or np.any(np.diff(stamps) < 0))
        ):
            raise _Abandoned  # wide ids, or not in arrival order: the whole-trace path sorts
        self.last_ms = float(stamps[-1]) if stamps.size else self.last_ms
        self.num_ids += ids.size
        self._check_parents(ids, chunk.offsets)
        num_tokens = chunk.input_lengths
        keys, offsets = chain_block_keys(ids, chunk.offsets, num_tokens, self.block_size, self.block_tokens)
        keys = keys.astype(np.int64)
        if keys.size and int(keys.max()) >= min(
            MAX_KEY_SPACE, self._id_space() * max(1, self.block_tokens // self.block_size)
        ):
            raise _Abandoned  # sparse key values: a rank per value would not be bounded by the keys
        distances = self.stack.distances(keys, offsets)
        del keys
        counts = np.diff(offsets)
        caps = np.maximum(num_tokens - 1, 0) // self.block_size  # kvbench.cache.block_hash.max_hit_blocks
        within = np.arange(distances.size, dtype=np.int64) - np.repeat(offsets[:-1], counts)
        hit = within < np.repeat(np.minimum(caps, counts), counts)
        del within
        warm = distances != COLD
        self.hits.add(distances[hit & warm])
        self.touches.add(distances[warm])
        self.blocks.append(counts.astype(np.int32))
        self.num_requests += int(num_tokens.size)
        self.num_prompt_tokens += int(num_tokens.sum())
        self.num_queried += int(caps.sum())

    def _id_space(self) -> int:
        """The largest id taken: ids beyond it are sparse (a rank per value would outgrow the keys)."""
        return max(8 * self.num_ids, 2 * self.expected_ids) + (1 << 24)

    def _check_parents(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        """:func:`~kvbench.sim.compact_curve.ids_name_prefixes` across chunks: an id's parent (the id
        before it in its prompt, -1 first) is the one it had in every chunk before."""
        if not ids_name_prefixes(ids, offsets):
            raise _Abandoned
        parents = np.empty(ids.size, dtype=np.int32)
        parents[1:] = ids[:-1]
        parents[offsets[:-1][offsets[:-1] < ids.size]] = -1
        top = int(ids.max(initial=-1)) + 1
        if top > MAX_KEY_SPACE // 2 or top > self._id_space():
            raise _Abandoned
        self.parents = grown(self.parents, top, -2)
        known = self.parents[ids]
        if np.any((known != -2) & (known != parents)):
            raise _Abandoned
        self.parents[ids] = parents

    def curve(self) -> StreamedCurve:
        size = TraceSize(self.num_requests, self.num_prompt_tokens, self.block_size)
        blocks = np.concatenate(self.blocks) if self.blocks else np.zeros(0, dtype=np.int32)
        return StreamedCurve(size, self.hits, self.touches, blocks, self.num_queried, self.stack.num_distinct)


def streamed_hit_curve(
    path: str | Path,
    format_name: str,
    block_size: int,
    limit: int | None = None,
    chunk_ids: int = CHUNK_IDS,
) -> StreamedCurve | None:
    """The exact tail-first curve of the first ``limit`` lines of a Mooncake / hash-id trace, read
    a chunk of ``chunk_ids`` ids at a time; ``None`` where this pass cannot vouch for it (see the
    module docstring: the whole-trace path, :func:`~kvbench.sim.compact_curve.compact_hit_curve`,
    then decides).

    Raises:
        ValueError: ``block_size`` refused by :func:`~kvbench.workloads.formats.hash_id_keys.key_refusal`.
    """
    time_format = HASH_ID_FORMATS[format_name]
    state = _Pass(block_size, time_format.block_tokens, expected_ids=estimated_ids(path))  # the whole file
    try:
        for chunk in hash_id_column_chunks(path, time_format, chunk_ids, limit):
            if chunk is None:
                return None
            state.add(chunk)
    except _Abandoned:
        return None
    return state.curve()
