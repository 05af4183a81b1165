"""The capacity fix: the smallest cache that reaches a share of the ideal hit, and what it weighs.

The ideal is the hit of the same cache with room for everything (the waterfall's hit plus its
capacity bar). Where the one pass is exact (:func:`kvbench.sim.curve.one_pass_refusal`: hash cache,
tail-first release, no TTL, full keys) the sizes come from the exact curve
(:class:`kvbench.sim.curve.HitCurve`), built on what each request *stores* (prompt + output - 1
tokens) with its prompt's last-token cap: the lookups are the prompt's leading keys, which are the
stored sequence's, so the stack-distance argument of :mod:`kvbench.sim.stack_distance` holds as for
prompts (``tests/explain/test_fixes.py`` checks it against the replay). Elsewhere (radix cache,
TTL, head-first) a bisection of replays finds each size (the hit grows with capacity).

Bytes: ``capacity_blocks x block_size x`` KV bytes per token (:class:`kvbench.memory.layout.KvLayout`)
for a model shape (:data:`kvbench.memory.presets.PRESETS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvbench.cache.base import CacheConfig, ReleaseOrder
from kvbench.memory.layout import KvLayout, ModelShape
from kvbench.sim.curve import HitCurve, one_pass_refusal
from kvbench.sim.replay import PreparedTrace, simulate
from kvbench.sim.stack_distance import stack_distances

SHARES = (0.5, 0.9, 0.99, 1.0)  # of the ideal hit: the sizes the capacity fix lists
WHOLE_IDEAL_SLACK = 1.1  # the fix names the whole ideal when it needs at most 10% more blocks than 99%


def headline(targets: Sequence[CapacityTarget]) -> CapacityTarget:
    """The size the capacity fix names: the whole ideal (share 1) when it costs at most
    :data:`WHOLE_IDEAL_SLACK` x the 99% size, else the 99% size (a long tail of rare prefixes can
    need far more memory for the last 1%)."""
    by_share = {t.share: t for t in targets}
    whole, most = by_share.get(1.0), by_share.get(0.99)
    if most is None or (
        whole is not None and whole.capacity_blocks <= WHOLE_IDEAL_SLACK * most.capacity_blocks
    ):
        return whole or targets[-1]
    return most


@dataclass(frozen=True)
class CapacityTarget:
    """The smallest ``capacity_blocks`` whose hit reaches ``share`` of the ideal (``hit_tokens``)."""

    share: float
    capacity_blocks: int
    hit_tokens: int


def kv_bytes(capacity_blocks: int, block_size: int, shape: ModelShape) -> int:
    """KV bytes of ``capacity_blocks`` blocks of ``block_size`` tokens for ``shape`` (its dtype)."""
    return capacity_blocks * KvLayout.of(shape, block_size=block_size).bytes_per_block


def stored_curve(trace: PreparedTrace) -> HitCurve:
    """The exact curve of a trace whose requests store ``trace.stored`` (module docstring)."""
    stored = trace.stored or trace.prompts
    lookups = [replace(s, num_tokens=p.num_tokens) for p, s in zip(trace.prompts, stored)]  # prompt's cap
    return HitCurve(trace, stack_distances(lookups))


def capacity_targets(
    trace: PreparedTrace, config: CacheConfig, shares: Sequence[float] = SHARES
) -> list[CapacityTarget]:
    """Per share, the smallest capacity (blocks) whose hit reaches ``share`` x the ideal hit (module
    docstring); ``[]`` when nothing can hit. ``config``'s capacity is ignored."""
    if one_pass_refusal(config) is None and config.release_order is ReleaseOrder.TAIL_FIRST:
        return _from_curve(stored_curve(trace), trace.block_size, shares)
    return _by_bisection(trace, config, shares)


def _from_curve(curve: HitCurve, block_size: int, shares: Sequence[float]) -> list[CapacityTarget]:
    distances = curve.hit_distances  # sorted: the k-th hit block arrives at capacity distances[k - 1]
    if distances.size == 0:
        return []
    targets = []
    for share in shares:
        needed = max(math.ceil(share * distances.size - 1e-9), 1)
        capacity = int(distances[needed - 1])
        hits = int(np.searchsorted(distances, capacity, side="right"))
        targets.append(CapacityTarget(share, capacity, hits * block_size))
    return targets


def _by_bisection(trace: PreparedTrace, config: CacheConfig, shares: Sequence[float]) -> list[CapacityTarget]:
    roomy = max(sum(s.num_full_blocks for s in trace.stored or trace.prompts), 1)

    def hit(capacity: int) -> int:
        return simulate(trace, replace(config, capacity_blocks=capacity)).num_cached_tokens

    return bisected(hit, roomy, shares)


def bisected(hit: Callable[[int], int], roomy: int, shares: Sequence[float] = SHARES) -> list[CapacityTarget]:
    """Per share, the smallest capacity in ``1 .. roomy`` blocks whose ``hit(capacity)`` (hit tokens)
    reaches ``share`` x ``hit(roomy)``, by bisection (the hit grows with capacity); ``[]`` when
    nothing can hit. The replay behind ``hit`` is the caller's: kvbench's cache or the paged pool."""
    ideal = hit(roomy)
    if ideal == 0:
        return []
    targets = []
    for share in shares:
        needed, low, high = math.ceil(share * ideal - 1e-9), 1, roomy
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if hit(middle) >= needed else (middle + 1, high)
        targets.append(CapacityTarget(share, low, hit(low)))
    return targets
