"""The hit rate as a function of TTL, for a cache that never runs out of room, in one pass.

"How long must my cache keep a prefix?" With unbounded capacity only the TTL drops blocks, and the
replay (:func:`kvbench.sim.replay.simulate`: the cache's clock reads each request's arrival;
a lookup first expires the unpinned blocks idle for longer than the TTL; every full block of a
request is touched and its idle timer restarts when the request releases it) hits block ``j`` of a
request arriving at ``now`` iff the block was last touched at ``t`` with ``t >= now - ttl``: its
*reuse time* ``now - t`` is at most the TTL. A chained lookup stops at its first miss, so the
request hits its leading blocks (within the last-token cap) whose prefix-max reuse time is
``<= ttl``. One pass with a dict of last-touch times gives every reuse time, hence the hit count at
every TTL at once. (The comparison is the replay's ``t >= now - ttl`` in floats; at an exact tie
rounding may differ.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kvbench.sim.replay import PreparedTrace


@dataclass(frozen=True, eq=False)
class TtlCurve:
    """Reuse times of a trace's hit-eligible blocks.

    Attributes:
        trace: the prepared trace (any block size; hash cache semantics).
        reuse_s: float64, shape (num_eligible_blocks,): for every block the last-token cap lets a
            lookup hit, the prefix-max reuse time in trace seconds (``inf`` for a block never seen).
    """

    trace: PreparedTrace
    reuse_s: np.ndarray

    @cached_property
    def _sorted(self) -> np.ndarray:
        return np.sort(self.reuse_s)

    def hit_blocks(self, ttls_s: np.ndarray) -> np.ndarray:
        """Hit blocks over the trace at each TTL (seconds, positive); int64, the shape of ``ttls_s``."""
        return np.searchsorted(self._sorted, np.asarray(ttls_s, dtype=np.float64), side="right")

    def token_hit_rates(self, ttls_s: np.ndarray) -> np.ndarray:
        """Cached / prompt tokens at each TTL (what the replay's ``token_hit_rate`` gives)."""
        tokens = self.trace.num_prompt_tokens
        return (
            self.hit_blocks(ttls_s) * self.trace.block_size / tokens if tokens else np.zeros(np.shape(ttls_s))
        )

    def change_points_s(self) -> np.ndarray:
        """The TTLs (seconds, ascending, positive) at which the hit count rises: the distinct finite
        reuse times (a reuse time of 0 hits at every TTL)."""
        finite = self._sorted[np.isfinite(self._sorted)]
        return np.unique(finite[finite > 0])

    def ttl_for_fraction_s(self, fraction: float) -> float | None:
        """The shortest TTL (s) that keeps ``fraction`` (0..1] of the never-expiring cache's hits;
        ``None`` when nothing ever hits."""
        finite = self._sorted[np.isfinite(self._sorted)]
        if not finite.size:
            return None
        index = max(int(np.ceil(fraction * finite.size)) - 1, 0)
        return float(finite[index])

    def rows(self) -> list[dict]:
        """One row per change point: ``ttl_s``, ``hit_blocks``, ``cached_prompt_tokens``,
        ``token_hit_rate``."""
        ttls = self.change_points_s()
        hits = self.hit_blocks(ttls)
        rates = self.token_hit_rates(ttls)
        return [
            {
                "ttl_s": float(ttl),
                "hit_blocks": int(hit),
                "cached_prompt_tokens": int(hit) * self.trace.block_size,
                "token_hit_rate": float(rate),
                "block_size": self.trace.block_size,
            }
            for ttl, hit, rate in zip(ttls, hits, rates)
        ]


def ttl_curve(trace: PreparedTrace) -> TtlCurve:
    """One pass over ``trace`` recording every hit-eligible block's reuse time. O(blocks)."""
    last_touch_s: dict[bytes, float] = {}
    reuse: list[float] = []
    for prompt, now_s in zip(trace.prompts, trace.arrivals_s.tolist()):
        keys, deepest = prompt.block_hashes, 0.0
        for key in keys[: prompt.max_hit_blocks]:
            seen_s = last_touch_s.get(key)
            deepest = max(deepest, now_s - seen_s if seen_s is not None else np.inf)
            reuse.append(deepest)
        last_touch_s.update(dict.fromkeys(keys, now_s))  # released now: every full block's timer restarts
    return TtlCurve(trace, np.asarray(reuse, dtype=np.float64))
