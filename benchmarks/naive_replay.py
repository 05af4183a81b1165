"""A naive reference for ``kvbench sim``: one straightforward replay per (size, release order).

Each replay hashes every prompt again (SHA-256 chained over uint32 little-endian token bytes, like
kvbench's keys), keeps an LRU of unpinned blocks in an ``OrderedDict`` and ref counts in a dict,
and follows the same rules as :func:`kvbench.sim.replay.simulate` (last-token cap, inserts that
evict the least recently used unpinned block and are refused when everything is pinned, release
tail first or head first). It exists only to time kvbench against; ``curve_bench.py`` checks that
its hit counts equal kvbench's.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np


def chained_keys(token_ids: np.ndarray, block_size: int) -> list[bytes]:
    keys, parent = [], hashlib.sha256(b"kvbench/root\x00").digest()
    data = np.asarray(token_ids, dtype="<u4")
    for start in range(0, (data.size // block_size) * block_size, block_size):
        parent = hashlib.sha256(parent + data[start : start + block_size].tobytes()).digest()
        keys.append(parent)
    return keys


def naive_replay(
    prompts: list[np.ndarray], block_size: int, capacity_blocks: int, tail_first: bool = True
) -> int:
    """Hit blocks of one replay of ``prompts`` (token-id arrays, arrival order) at one capacity."""
    held: dict[bytes, int] = {}  # key -> ref count
    lru: OrderedDict[bytes, None] = OrderedDict()  # unpinned keys, least recent first
    num_hits = 0
    for token_ids in prompts:
        keys = chained_keys(token_ids, block_size)
        cap = max(len(token_ids) - 1, 0) // block_size
        pinned = []
        for key in keys[:cap]:
            if key not in held:
                break
            lru.pop(key, None)
            held[key] += 1
            pinned.append(key)
        num_hits += len(pinned)
        for key in keys[len(pinned) :]:
            if key in held:
                lru.pop(key, None)
                held[key] += 1
            elif len(held) < capacity_blocks:
                held[key] = 1
            elif lru:
                victim, _ = lru.popitem(last=False)
                del held[victim]
                held[key] = 1
            else:
                break
            pinned.append(key)
        for key in reversed(pinned) if tail_first else pinned:
            held[key] -= 1
            if not held[key]:
                lru[key] = None
    return num_hits
