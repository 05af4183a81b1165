"""The bounded replay behind ``kvbench explain``: hits per request, and for every request that lost
blocks, when its first missing block was last used and how many blocks were stored since.

It is :func:`kvbench.sim.replay.simulate` (the one replay loop) with an observer; a second replay
with the same TTL and room for everything tells expiry from eviction (a block the TTL alone would
have dropped is ``expired``; any other loss is ``evicted``, by capacity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvbench.cache.base import CacheConfig
from kvbench.cache.block_hash import PromptBlocks
from kvbench.sim.replay import PreparedTrace, simulate
from kvbench.sim.step import StepResult


@dataclass(frozen=True)
class LastUse:
    """Where a request's first missing block was last used: the position of that request, its arrival
    (s), and the blocks stored between then and the request that missed it."""

    position: int
    arrival_s: float
    num_blocks_stored_since: int


@dataclass(frozen=True)
class ReplayDetails:
    """Per replayed position: ``hit_tokens``; ``ttl_hit_tokens`` (the same TTL with room for
    everything; ``None`` without a TTL); ``last_use`` of the first block it missed, or ``None``."""

    hit_tokens: np.ndarray
    ttl_hit_tokens: np.ndarray | None
    last_use: list[LastUse | None]


def replay_details(
    prompts: Sequence[PromptBlocks],
    stored: Sequence[PromptBlocks],
    arrivals_s: np.ndarray,
    config: CacheConfig,
) -> ReplayDetails:
    """Replay in the order given (``arrivals_s`` is the TTL's clock) through ``config``'s cache."""
    trace = PreparedTrace(
        list(prompts), np.asarray(arrivals_s, dtype=np.float64), config.block_size, list(stored)
    )
    last_touch: dict[bytes, tuple[int, float, int]] = {}  # key -> (position, arrival, blocks stored before)
    num_stored = [0]
    last_use: list[LastUse | None] = []

    def observe(index: int, done: StepResult) -> None:
        prompt, arrival, new = trace.prompts[index], float(trace.arrivals_s[index]), done.new
        hit = done.num_hit_blocks
        touched = last_touch.get(prompt.block_hashes[hit]) if hit < prompt.max_hit_blocks else None
        last_use.append(
            None if touched is None else LastUse(touched[0], touched[1], num_stored[0] - touched[2])
        )
        keys = trace.stored[index].block_hashes
        for key in keys[: hit + new.num_inserted_blocks + new.num_existing_blocks]:
            last_touch[key] = (index, arrival, num_stored[0])
        num_stored[0] += new.num_inserted_blocks

    hits = simulate(trace, config, observe).cached_tokens_per_request
    ttl_hits = None
    if config.ttl_s is not None:
        roomy = replace(config, capacity_blocks=max(sum(s.num_full_blocks for s in stored), 1))
        ttl_hits = simulate(trace, roomy).cached_tokens_per_request
    return ReplayDetails(hits, ttl_hits, last_use)
