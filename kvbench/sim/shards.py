"""A sampled hit-rate curve for traces too big for the exact pass: spatial sampling (SHARDS).

SHARDS (Waldspurger et al., "Efficient MRC Construction with SHARDS", FAST 2015) keeps the accesses
whose key hashes under a threshold, a fixed fraction ``R`` of the keys, runs the stack-distance
pass over those only, and scales: a sampled distance ``d`` stands for ``d / R`` blocks, a sampled
hit for ``1 / R`` hits. Block keys are SHA-256 (or xxh3) digests, so their first 8 bytes are
uniform and the sample is the same keys whatever the trace order. The chain property still holds
on the sample (a kept key is warm only if every kept key before it in the prompt is), so the pass
of :mod:`kvbench.sim.stack_distance` runs on it unchanged.

This is the fixed-rate variant: memory and time scale with ``R`` (the fixed-memory variant that
lowers the rate as distinct keys accumulate, and streaming the trace, are not built).

Measured error (max absolute token-hit-rate error over 120 log-spaced sizes; ``tests/sim/test_shards.py``
and issue 18's note): prefix-cache traces put their hits on few keys (a hot prefix is a handful of
blocks, every request of it touches the same ones), so the estimate's variance is that of the
hottest prefixes' sampled keys, far above SHARDS' block-trace figures. At ``R = 0.1``:
multi_prefix_zipf 0.022, multi_prefix_rr 0.089 (at the cliff), 300 Zipf prefixes 0.119, Mooncake
conversation 0.044 (one key, the shared first block, carries 4.5 of its 37 points of hit rate);
at ``R = 0.3`` on the 300 prefixes 0.024. Use it for a first look at traces the exact pass cannot
hold, not for sizing within a percent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.sim.replay import PreparedTrace
from kvbench.sim.stack_distance import COLD, distances_of

_HASH_SPACE = 2**64


def sampled(key: bytes, threshold: int) -> bool:
    """Whether ``key`` is in the sample whose first 8 bytes (big-endian) fall under ``threshold``."""
    return int.from_bytes(key[:8], "big") < threshold


@dataclass(frozen=True, eq=False)
class SampledCurve:
    """Estimated hit counts from a spatial sample at rate ``rate``.

    Attributes:
        trace: the full trace (its token counts are the denominators).
        rate: the fraction of keys kept, in (0, 1].
        scaled_distances: float64, shape (num_eligible_sampled,): sorted ``distance / rate`` of the
            kept blocks the last-token cap lets hit (cold ones excluded).
    """

    trace: PreparedTrace
    rate: float
    scaled_distances: np.ndarray

    def hit_blocks(self, capacities_blocks: np.ndarray) -> np.ndarray:
        """Estimated hit blocks over the trace at each capacity; float64."""
        counts = np.searchsorted(self.scaled_distances, np.asarray(capacities_blocks, dtype=np.float64), side="right")
        return counts / self.rate

    def token_hit_rates(self, capacities_blocks: np.ndarray) -> np.ndarray:
        """Estimated cached / prompt tokens at each capacity."""
        tokens = self.trace.num_prompt_tokens
        return self.hit_blocks(capacities_blocks) * self.trace.block_size / tokens if tokens else \
            np.zeros(np.shape(capacities_blocks))


def sampled_curve(trace: PreparedTrace, rate: float) -> SampledCurve:
    """One pass over the keys of ``trace`` that hash under ``rate`` (hash cache, tail-first, no TTL,
    full keys: the conditions of the exact curve).

    Raises:
        ValueError: ``rate`` outside (0, 1].
    """
    if not 0 < rate <= 1:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    threshold = int(rate * _HASH_SPACE)
    key_lists, eligible = [], []
    for prompt in trace.prompts:
        cap = prompt.max_hit_blocks
        kept = [(j, key) for j, key in enumerate(prompt.block_hashes) if sampled(key, threshold)]
        key_lists.append(tuple(key for _, key in kept))
        eligible.extend(j < cap for j, _ in kept)
    distances, _, _ = distances_of(key_lists)
    distances = distances[np.asarray(eligible, dtype=bool)] if distances.size else distances
    return SampledCurve(trace, rate, np.sort(distances[distances != COLD].astype(np.float64) / rate))
