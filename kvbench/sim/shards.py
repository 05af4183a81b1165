"""A sampled hit-rate curve in bounded memory for traces too big for the exact pass: SHARDS.

SHARDS (Waldspurger et al., "Efficient MRC Construction with SHARDS", FAST 2015) keeps the accesses
whose key hashes under a threshold ``T`` (rate ``R = T / 2**64``), runs the LRU stack-distance pass
over those keys only (counting, per access, the held keys used since: a byte per time slot,
counted at C speed), and scales: a sampled hit stands for ``1 / R`` hits, and each *other* sampled
key used since a key's last use for ``1 / R`` blocks of its distance, the key itself for 1 (it is
in the sample for sure: counted at ``1 / R`` like the others, as in the paper, every distance sat
``1 / R - 1`` blocks too deep, and every estimate below the truth by the hits of those
sizes; ``benchmarks/shards_calibration.py``). *Fixed-size* SHARDS bounds the memory: when more
than ``max_keys`` keys are held, ``T`` drops to the largest held hash, the keys above it are
dropped, and the histogram so far is rescaled by ``R_new / R_old`` (as if sampled at the new rate
from the start). Block keys are digests (SHA-256 or :mod:`kvbench.workloads.formats.hash_id_keys`'
mixed ids), so their first 8 bytes are the hash, the same keys whatever the trace order.

Prefix chains: the chain property holds on any sample (a kept key is warm only if every
kept key before it in the prompt is), so a request's sampled hits are its leading kept keys whose
prefix-max scaled distance is ``<= C``, and cold keys end the pass over a request as in
:mod:`kvbench.sim.stack_distance`. What hurts is where the hits sit: a prefix cache's hits
concentrate on the keys every request shares (a system prompt's blocks). A key is in the sample or
not, so the estimate's standard deviation is ``sqrt((1 - R) / R * sum_k h_k**2)`` for ``h_k`` the
hit rate key ``k``'s hits contribute (its hit tokens / all prompt tokens; Horvitz-Thompson): one key
contributing 0.045 (the Mooncake conversation trace's shared first block, of its 0.37) gives 0.135
at ``R = 0.1``. So the first
``exact_blocks`` blocks of every prompt (default 1) have a threshold of their own, starting at
``min(1, R * 2**32)`` (always sampled), lowered only while they hold more than half of ``max_keys``
(with one threshold for both, 100,421 distinct first blocks of one-off prompts in a
65,536-key budget drove the other keys' rate to ~1e-10 and the estimate to 0.41 for 0.85).
The estimate reported is not plain SHARDS' ``sampled hits / R`` but a regression on the sampled
count of queried references, whose exact total is known (:mod:`kvbench.sim.shards_adjust`: SHARDS'
fixed-size adjustment ``SHARDS_adj`` is its case ``beta = 1``, plain SHARDS ``beta = 0``; kvbench
fits ``beta`` per capacity on the first blocks). A sample that missed (or caught) a hot key also
has too few (too many) sampled references, and the regression puts back the hits they stand for:
on ``benchmarks/mixed_trace.py`` shapes at 100k requests and 4,096 keys the rms error fell 1.8-3x
against plain SHARDS (``benchmarks/shards_calibration.py``), though at 10k requests and 2,048 keys
it rose 1.3-2.7x on two shapes of three (a gap of conversation history, unlike the first blocks).
:meth:`SampledCurve.hit_rate_sds` is its standard deviation at each size, estimated from the sample
(dropped keys' terms kept: their hits stay in the estimate), widened by the ratio of the reference
gap to its own sd when the gap is larger; :attr:`SampledCurve.hit_rate_sd` the largest over the
sizes from ``1 / R`` up. The sd is honest, not a bound: ~70% of seeds fall within 1 sd and ~all
within 2 sd (docs/measured-results.md); it cannot see a hot key the sample missed whose first block
behaves unlike it. A sampled
key stands for ``1 / R`` blocks, so sizes below ``1 / R`` blocks are coarse: on
``benchmarks/shards_synthetic.py`` (1M requests, 65,536 keys, R 0.065, plain SHARDS) the max error
is 0.028 at 4 blocks and 0.0027 from 16 blocks up; at 10M requests and 16,384 keys (R 0.0016)
0.0039 from 609 blocks up, in 58 MiB of peak RSS against 4,684 MiB for the exact pass.

Measured error of plain SHARDS (max |sampled - exact| token hit rate, 200 log-spaced sizes, mean in brackets;
``benchmarks/shards_bench.py``, docs/curves-and-sampling.md "Traces of any size"): fixed-size at 16,384 keys,
Mooncake
conversation (170,899 distinct keys, final rate 0.096) 0.0033 (0.0009), Mooncake synthetic (rate
0.39) 0.0085 (0.0022); at 4,096 keys multi_prefix_zipf 0.0039, 300 Zipf prefixes 0.0083, but
multi_prefix_rr 0.025 and Mooncake conversation 0.013. Observed bound: within 0.01 at every size
once the budget is at least 16,384 keys and 10% of the distinct keys. Curves with a cliff
(round-robin prefixes) have their max error at the cliff: a 1% shift of the cliff's capacity is
the whole jump at the sizes in between (the mean stays ~0.001).

Histogram: scaled distances up to :data:`EXACT_BINS` blocks are binned exactly (so rate 1 gives
the exact curve); above, in bins 1/1024 wide in log capacity, each counted at its upper edge (the
estimate at ``C`` then misses hits at most 0.1% below ``C``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvbench.sim.replay import PreparedTrace
from kvbench.sim.shards_adjust import (
    ADJUSTMENTS,
    Adjustment,
    KeySums,
    adjustments,
    grid_floor,
    grid_index,
)
from kvbench.sim.shards_slots import Slots

HASH_SPACE = 2**64
_SLICE_REQUESTS = 1024  # requests whose keys are picked under one threshold in numpy (add_chunk)
EXACT_BINS = 1 << 16  # scaled distances up to here are their own bin (exact at rate 1)
_LOG_BINS_PER_E = 1024  # above: bins 1/1024 wide in ln(capacity)
_BOOST = 2**32  # the first exact_blocks blocks of a prompt are sampled at min(1, R * 2**32)

INTERVAL_Z = 1.96  # the printed 95% interval: estimate +- 1.96 sd (a two-sided normal quantile)


def key_hash(key: bytes) -> int:
    """A block key's sampling hash: its first 8 bytes, big-endian (uniform for digests)."""
    return int.from_bytes(key[:8], "big")


def _bin(scaled: float) -> int:
    if scaled <= EXACT_BINS:
        return math.ceil(scaled)
    return EXACT_BINS + math.ceil(math.log(scaled / EXACT_BINS) * _LOG_BINS_PER_E)


def _bin_edges(num_bins: int) -> np.ndarray:
    """Upper edge (blocks) of bins ``0 .. num_bins - 1``; float64."""
    index = np.arange(num_bins, dtype=np.float64)
    return np.where(index <= EXACT_BINS, index, EXACT_BINS * np.exp((index - EXACT_BINS) / _LOG_BINS_PER_E))


@dataclass(frozen=True, eq=False)
class SampledCurve:
    """Estimated hit blocks at every capacity from a (fixed-size) spatial sample.

    Attributes:
        edges_blocks: float64, shape (num_bins,): ascending capacities where the estimate can change
            (the last: where it reaches the unbounded cache's estimate).
        hit_blocks_at_edges: float64, same shape: estimated hit blocks at each edge (cumulative).
        rate: the final sampling rate, in (0, 1].
        num_requests / num_prompt_tokens / block_size: of the whole trace (exact).
        max_keys_held: the most keys the sample held at once (the memory, in keys): the peak, while
            one request's new keys are inserted before the drop back to the budget.
        hit_rate_sd: estimated standard deviation of the token hit rate at the unbounded cache.
        max_keys_kept: the most keys held between requests (after the drop): at most the budget
            ``max_keys``, first blocks included.
        max_keys: the key budget (``None``: a fixed rate).
        first_block_rate: the final sampling rate of the first ``exact_blocks`` blocks of each
            prompt (their own threshold), in (0, 1].
    """

    edges_blocks: np.ndarray
    hit_blocks_at_edges: np.ndarray
    rate: float
    num_requests: int
    num_prompt_tokens: int
    block_size: int
    max_keys_held: int
    hit_rate_sd: float
    max_keys_kept: int = 0
    max_keys: int | None = None
    first_block_rate: float = 1.0
    grid_adjust_blocks: np.ndarray | None = None  # (3, NUM_GRID): hit blocks each Adjustment adds
    grid_variance_blocks: np.ndarray | None = None  # (3, NUM_GRID): each one's variance, blocks**2
    adjustment: Adjustment = Adjustment.REGRESSION

    @property
    def ideal_capacity_blocks(self) -> int:
        """The smallest capacity (blocks) at which the estimate reaches its unbounded-cache value."""
        return max(math.ceil(self.edges_blocks[-1]), 1)

    def hit_blocks(self, capacities_blocks, adjustment: Adjustment | None = None) -> np.ndarray:
        """Estimated hit blocks over the trace at each capacity (blocks); float64, same shape.
        ``adjustment``: the estimator (:mod:`kvbench.sim.shards_adjust`; ``None``: :attr:`adjustment`)."""
        capacities = np.asarray(capacities_blocks, dtype=np.float64)
        index = np.searchsorted(self.edges_blocks, capacities, side="right")
        hits = np.where(index > 0, self.hit_blocks_at_edges[np.maximum(index - 1, 0)], 0.0)
        row = ADJUSTMENTS.index(adjustment or self.adjustment)
        if self.grid_adjust_blocks is None or row == 0:
            return hits
        return np.where(
            capacities >= 1, np.maximum(hits + self.grid_adjust_blocks[row, grid_floor(capacities)], 0), 0.0
        )

    def token_hit_rates(self, capacities_blocks, adjustment: Adjustment | None = None) -> np.ndarray:
        """Estimated cached / prompt tokens at each capacity; float64, same shape."""
        if not self.num_prompt_tokens:
            return np.zeros(np.shape(capacities_blocks))
        return self.hit_blocks(capacities_blocks, adjustment) * self.block_size / self.num_prompt_tokens

    def hit_rate_sds(self, capacities_blocks, adjustment: Adjustment | None = None) -> np.ndarray:
        """The estimate's standard deviation (token hit rate) at each capacity, estimated from the
        sample (:mod:`kvbench.sim.shards_adjust`); float64, same shape."""
        capacities = np.asarray(capacities_blocks, dtype=np.float64)
        if self.grid_variance_blocks is None or not self.num_prompt_tokens:
            return np.zeros(capacities.shape)
        variance = self.grid_variance_blocks[ADJUSTMENTS.index(adjustment or self.adjustment)]
        return np.sqrt(variance[grid_floor(capacities)]) * self.block_size / self.num_prompt_tokens


class ShardsPass:
    """The online pass: :meth:`add` each request's keys (or :meth:`add_chunk` many requests' at once)
    in arrival order, then :meth:`curve`.

    Memory: at most ``max_keys`` held keys, plus one request's between its insert and the drop
    (a dict entry, a heap entry, two one-byte time slots and a few hit counts per grid capacity each,
    time slots renumbered when they reach twice the live ones) plus the histogram's bins.

    Raises:
        ValueError: ``rate`` outside (0, 1], ``max_keys < 1``, ``exact_blocks < 0``.
    """

    def __init__(
        self, block_size: int, rate: float = 1.0, max_keys: int | None = None, exact_blocks: int = 1
    ) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        if max_keys is not None and max_keys < 1:
            raise ValueError(f"max_keys must be positive, got {max_keys}")
        if exact_blocks < 0:
            raise ValueError(f"exact_blocks must be >= 0, got {exact_blocks}")
        self.block_size, self.max_keys, self.exact_blocks = block_size, max_keys, exact_blocks
        self._arguments = (block_size, rate, max_keys, exact_blocks)
        self.threshold = min(int(rate * HASH_SPACE), HASH_SPACE)
        self.first_threshold = min(self.threshold * _BOOST, HASH_SPACE)  # the first blocks' own
        # sampling hash -> [slot, boosted, queried references, {grid point: hits}]
        self._held: dict[int, list] = {}
        self._heaps: tuple[list, list] = ([], [])  # plain, first blocks: (-hash, hash), next to drop on top
        self._slots = Slots(2 * (max_keys or 1 << 16))
        self._histograms = (np.zeros(EXACT_BINS + 1), np.zeros(EXACT_BINS + 1))  # plain, boosted
        self._scales = [1.0, 1.0]  # histogram[c] * scales[c] = sampled hits at today's rate (rescaled lazily)
        self._references = [0.0, 0.0]  # sampled queried references, rescaled as the histograms
        self._queried = [0, 0]  # every queried reference of the trace (exact), per class
        self._dropped = KeySums()  # the terms of the keys dropped with their hits counted
        self.num_requests = self.num_prompt_tokens = self.max_keys_held = self.max_keys_kept = 0

    def reset(self) -> None:
        """Forget every request added (as newly built with the same arguments)."""
        self.__init__(*self._arguments)

    def rates(self) -> tuple[float, float]:
        """``(plain, first blocks)`` inclusion probabilities now."""
        return self.threshold / HASH_SPACE, self.first_threshold / HASH_SPACE

    def add(self, hashes: Iterable[int], max_hit_blocks: int, num_tokens: int) -> None:
        """One request: the sampling hashes of its full blocks in chain order, its last-token cap
        and its prompt length in tokens."""
        hashes = list(hashes)
        self.num_requests += 1
        self.num_prompt_tokens += num_tokens
        queried = min(len(hashes), max_hit_blocks)
        self._queried[1] += min(queried, self.exact_blocks)
        self._queried[0] += queried - min(queried, self.exact_blocks)
        self._add_kept(list(enumerate(hashes)), max_hit_blocks)

    def _add_kept(self, candidates: list[tuple[int, int]], cap: int) -> None:
        threshold, first_threshold, exact = self.threshold, self.first_threshold, self.exact_blocks
        kept = [(j, h) for j, h in candidates if h < (first_threshold if j < exact else threshold)]
        if kept:
            self._access(kept, cap)

    def add_chunk(
        self, hashes: np.ndarray, offsets: np.ndarray, max_hit_blocks: np.ndarray, num_tokens: np.ndarray
    ) -> None:
        """Many requests in arrival order, as :meth:`add` each: ``hashes`` uint64, flat, request
        ``r``'s at ``hashes[offsets[r]:offsets[r + 1]]``; ``max_hit_blocks`` and ``num_tokens`` int,
        shape (num_requests,). The keys under today's thresholds are picked in numpy; only those go
        through the per-key pass (a threshold lowered mid-chunk is applied there)."""
        counts = np.diff(offsets)
        queried = np.minimum(counts, max_hit_blocks)
        first = np.minimum(queried, self.exact_blocks)
        self._queried[1] += int(first.sum())
        self._queried[0] += int((queried - first).sum())
        self.num_prompt_tokens += int(num_tokens.sum())
        self.num_requests += int(counts.size)
        request = np.repeat(np.arange(counts.size), counts)
        within = np.arange(hashes.size, dtype=np.int64) - offsets[request]
        caps = max_hit_blocks.tolist()
        for first_row in range(0, counts.size, _SLICE_REQUESTS):  # thresholds fall as the pass goes
            begin, end = offsets[first_row], offsets[min(first_row + _SLICE_REQUESTS, counts.size)]
            part = slice(int(begin), int(end))
            plain, first = _under(hashes[part], self.threshold), _under(hashes[part], self.first_threshold)
            kept = begin + np.flatnonzero(np.where(within[part] < self.exact_blocks, first, plain))
            rows, positions, values = request[kept], within[kept].tolist(), hashes[kept].tolist()
            starts = np.flatnonzero(np.diff(rows, prepend=-1)).tolist() + [kept.size]
            for start, stop in zip(starts[:-1], starts[1:]):
                pairs = list(zip(positions[start:stop], values[start:stop]))
                self._add_kept(pairs, caps[int(rows[start])])

    def _access(self, kept: list[tuple[int, int]], cap: int) -> None:
        rates, held, slots = self.rates(), self._held, self._slots
        deepest, warm = 0.0, True
        for j, h in kept:  # distances before the request, against the sample as the others left it
            entry = held.get(h) if warm else None
            if entry is None:
                warm = False
                continue
            plain, boosted = slots.live_at_or_after(entry[0])  # the key itself included
            plain, boosted = (plain - 1, boosted) if entry[1] == 0 else (plain, boosted - 1)
            # the key itself is in the sample for sure: 1 block, not 1 / rate
            deepest = max(deepest, 1 + plain / rates[0] + boosted / rates[1])
            if j < cap:
                self._count(_bin(deepest), entry[1])
                point = grid_index(deepest)
                entry[3][point] = entry[3].get(point, 0) + 1
        for j, h in reversed(kept):  # tail first: the chain's first key ends most recent
            entry = held.get(h)
            boosted = int(j < self.exact_blocks)
            if entry is None:
                held[h] = entry = [None, boosted, 0, {}]
                heapq.heappush(self._heaps[boosted], (-h, h))
            else:
                slots.remove(entry[0], entry[1])
                entry[0] = None
            if j < cap:
                entry[2] += 1
                self._references[boosted] += 1.0 / self._scales[boosted]
            entry[0] = slots.append(entry[1], held)
        self.max_keys_held = max(self.max_keys_held, len(held))
        if self.max_keys is not None and len(held) > self.max_keys:
            self._lower_threshold()
        self.max_keys_kept = max(self.max_keys_kept, len(held))

    def _count(self, index: int, boosted: int) -> None:
        """One sampled hit in bin ``index`` of the plain (0) or boosted (1) histogram, growing both."""
        if index >= self._histograms[boosted].size:
            grown = tuple(np.zeros(max(index + 1, 2 * h.size)) for h in self._histograms)
            for new, old in zip(grown, self._histograms):
                new[: old.size] = old
            self._histograms = grown
        self._histograms[boosted][index] += 1.0 / self._scales[boosted]

    def _lower_threshold(self) -> None:
        """Fixed-size SHARDS, one threshold per class: drop the held keys with the largest hash
        until ``max_keys`` fit, from the first blocks while they hold more than half the budget,
        else from the others; a class's threshold becomes its last dropped hash, and its histogram
        is rescaled. So first blocks never take the other keys' budget (with one threshold, 100,421
        distinct first blocks in a 65,536-key budget drove the rate to ~1e-10)."""
        old = self.rates()
        thresholds = [self.threshold, self.first_threshold]
        num_first = len(self._heaps[1])
        while len(self._held) > self.max_keys:
            boosted = int(num_first > self.max_keys // 2)
            _, h = heapq.heappop(self._heaps[boosted])
            entry = self._held.pop(h)
            self._slots.remove(entry[0], entry[1])
            self._dropped.add(boosted, old[boosted], entry[2], entry[3])  # its hits stay in the estimate
            thresholds[boosted] = max(min(thresholds[boosted], h), 1)  # held keys: hash < threshold
            num_first -= boosted  # every held key has one heap entry, in its class's heap
        self.threshold, self.first_threshold = thresholds
        new = self.rates()
        self._scales = [scale * after / before for scale, before, after in zip(self._scales, old, new)]

    def curve(self) -> SampledCurve:
        """The estimate so far: hit blocks scaled by ``1 / rate`` per class, with the corrections
        and variances of :mod:`kvbench.sim.shards_adjust` (reported: the regression's)."""
        rates = self.rates()
        estimate = self._histograms[0] * (self._scales[0] / rates[0]) + self._histograms[1] * (
            self._scales[1] / rates[1]
        )
        # up to the last hit
        estimate = estimate[: int(np.flatnonzero(estimate)[-1]) + 1 if estimate.any() else 1]
        edges = _bin_edges(estimate.size)
        sums = KeySums()
        for _, boosted, num_refs, bins in self._held.values():
            sums.add(boosted, rates[boosted], num_refs, bins)
        gaps = np.array([self._queried[c] - self._references[c] * self._scales[c] / rates[c] for c in (0, 1)])
        grid_adjust, grid_variance = adjustments(sums.plus(self._dropped), gaps)
        sd = 0.0
        if self.num_prompt_tokens:  # the largest over the sizes from 1 / R to the unbounded cache
            low, high = grid_floor(np.array([1 / rates[0], max(edges[-1], 1 / rates[0])]))
            sd = math.sqrt(grid_variance[2, low : high + 1].max()) * self.block_size / self.num_prompt_tokens
        return SampledCurve(
            edges_blocks=edges,
            hit_blocks_at_edges=np.cumsum(estimate),
            rate=rates[0],
            num_requests=self.num_requests,
            num_prompt_tokens=self.num_prompt_tokens,
            block_size=self.block_size,
            max_keys_held=self.max_keys_held,
            hit_rate_sd=sd,
            max_keys_kept=self.max_keys_kept,
            max_keys=self.max_keys,
            first_block_rate=rates[1] if self.exact_blocks else rates[0],
            grid_adjust_blocks=grid_adjust,
            grid_variance_blocks=grid_variance,
        )


def _under(hashes: np.ndarray, threshold: int) -> np.ndarray:
    """``hashes < threshold`` for uint64 ``hashes`` and a threshold up to ``2**64``; bool."""
    if threshold >= HASH_SPACE:
        return np.ones(hashes.shape, dtype=bool)
    return hashes < np.uint64(threshold)


def sampled_curve(
    trace: PreparedTrace, rate: float = 1.0, max_keys: int | None = None, exact_blocks: int = 1
) -> SampledCurve:
    """The sampled curve of an in-memory ``trace`` (hash cache, tail-first, no TTL, full keys: the
    conditions of the exact curve). See :class:`ShardsPass` for the arguments and errors."""
    shards = ShardsPass(trace.block_size, rate, max_keys, exact_blocks)
    for prompt in trace.prompts:
        shards.add([key_hash(key) for key in prompt.block_hashes], prompt.max_hit_blocks, prompt.num_tokens)
    return shards.curve()
