"""An explicit multi-tier prefix cache, replayed request by request: the check on :func:`tier_split`.

Every level is an LRU over block keys (an ``OrderedDict``, least recent first). Per request with full
blocks ``k_0 .. k_{n-1}`` and last-token cap ``m``, at concurrency 1 (as :func:`kvbench.sim.replay.simulate`):

1. *lookup*: walk ``k_0 ..`` up to ``m`` blocks; each block is served by the fastest level holding
   it; stop at the first block no level holds;
2. *GPU*: the GPU hits are pinned; every other block of the request (loaded from a tier or computed)
   is stored in the GPU, evicting its least recent unpinned block, or refused when every block is
   pinned; exclusive: an evicted block is demoted to tier 1 (and a tier's own victim one tier
   down), a block loaded from a tier leaves it (promotion);
3. *inclusive*: every block of the request is stored in (or refreshed at) every tier, ``k_{n-1}``
   first so ``k_0`` ends most recent; a tier's least recent block goes when it is full;
4. *release*: the request's GPU blocks are unpinned, ``k_{n-1}`` first (tail-first: ``k_0`` ends most
   recent, the order vLLM's free queue gets).

Pure Python, O(blocks) per request: for checks and for the cases the one pass refuses.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvbench.cache.block_hash import PromptBlocks
from kvbench.sim.tiers import Tier, TierPolicy, TierSplit


class _Levels:
    """The GPU (index 0) and the tiers below it, as LRU key maps."""

    def __init__(self, gpu_blocks: int, tiers: tuple[Tier, ...], policy: TierPolicy) -> None:
        self.capacities = [gpu_blocks, *(t.capacity_blocks for t in tiers)]
        self.levels: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in self.capacities]
        self.exclusive = policy is TierPolicy.EXCLUSIVE

    def holder(self, key: bytes) -> int | None:
        """The fastest level holding ``key``, or ``None``."""
        return next((index for index, level in enumerate(self.levels) if key in level), None)

    def put_below(self, index: int, key: bytes) -> None:
        """Store ``key`` at level ``index >= 1`` (most recent); its overflow moves down (exclusive) or
        goes."""
        while index < len(self.levels):
            level = self.levels[index]
            level[key] = None
            level.move_to_end(key)
            if len(level) <= self.capacities[index]:
                return
            key, _ = level.popitem(last=False)
            if not self.exclusive:
                return
            index += 1

    def store_in_gpu(self, key: bytes, pinned: set[bytes]) -> bool:
        """Store ``key`` in the GPU, evicting its least recent unpinned block; ``False``: refused."""
        gpu = self.levels[0]
        if len(gpu) >= self.capacities[0]:
            victim = next((k for k in gpu if k not in pinned), None)
            if victim is None:
                return False
            del gpu[victim]
            if self.exclusive and len(self.levels) > 1:
                self.put_below(1, victim)
        gpu[key] = None
        return True


def _serve(levels: _Levels, prompt: PromptBlocks, hits: np.ndarray, column: int) -> None:
    """One request through ``levels``; its hit blocks per level go into ``hits[:, column]``."""
    keys = prompt.block_hashes
    for key in keys[: prompt.max_hit_blocks]:
        index = levels.holder(key)
        if index is None:
            break
        hits[index, column] += 1
    gpu, pinned = levels.levels[0], set()
    for key in keys:
        if key in gpu:  # a GPU hit, or a block held beyond the lookup's cap: pinned where it is
            pinned.add(key)
            continue
        holder = levels.holder(key) if levels.exclusive else None
        if holder is not None:
            del levels.levels[holder][key]  # promoted: it leaves its tier
        if levels.store_in_gpu(key, pinned):
            pinned.add(key)
        elif holder is not None:
            levels.put_below(holder, key)  # the GPU refused it: it stays where it was
    if not levels.exclusive:
        for key in reversed(keys):
            for index in range(1, len(levels.levels)):
                levels.put_below(index, key)
    for key in reversed(keys):
        if key in pinned:
            gpu.move_to_end(key)


def replay_tiers(
    prompts: list[PromptBlocks], gpu_blocks: int, tiers: tuple[Tier, ...], policy: TierPolicy, block_size: int
) -> TierSplit:
    """Replay ``prompts`` (arrival order) through the explicit hierarchy (module docstring).

    Raises:
        ValueError: ``gpu_blocks`` is not positive.
    """
    if gpu_blocks <= 0:
        raise ValueError(f"gpu_blocks must be positive, got {gpu_blocks}")
    levels = _Levels(gpu_blocks, tiers, policy)
    hits = np.zeros((len(levels.capacities), len(prompts)), dtype=np.int64)
    for column, prompt in enumerate(prompts):
        _serve(levels, prompt, hits, column)
    num_tokens = np.fromiter((p.num_tokens for p in prompts), dtype=np.int64, count=len(prompts))
    return TierSplit(gpu_blocks, tuple(tiers), policy, hits, block_size, num_tokens, "replay")
