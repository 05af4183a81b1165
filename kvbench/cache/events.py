"""What a cache tells a listener about its blocks: stored, removed, every block cleared (pure Python).

The caches (:class:`~kvbench.cache.hash_cache.HashPrefixCache`, the paged engine's
:class:`~kvbench.cache.block_index.PoolIndex` over its :class:`~kvbench.cache.block_pool.BlockPool`,
the :class:`~kvbench.cache.host_tier.HostTierIndex`) hold a ``listener`` attribute, ``None`` by
default: each store, eviction, expiry and reset then costs one ``is None`` test and nothing more.
With a listener they call it in the thread that changes the cache, once per block, in the order the
changes happen. The three calls are vLLM's three KV cache events (``vllm/distributed/kv_events.py``:
``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``); :mod:`kvbench.events` turns them into
vLLM's wire format.

``key`` is the cache's own key of the block (a chained :data:`~kvbench.cache.block_hash.BlockHash`,
or a radix pool key ``(parent, token bytes)``), the same object at store and removal; ``parent_key``
the key of the block before it in its sequence (``None`` for block 0); ``token_ids`` the block's
``block_size`` token ids; ``medium`` where the block lives: :data:`MEDIUM_GPU` (the pool, the copy
engine's cache) or :data:`MEDIUM_CPU` (the host tier), vLLM's names.
"""

from __future__ import annotations

import struct
from collections.abc import Hashable, Sequence
from typing import Protocol

MEDIUM_GPU = "GPU"  # vLLM's MEDIUM_GPU: the device pool (kvbench's pool lives on any device)
MEDIUM_CPU = "CPU"  # the host tier (vLLM's offloading connector reports "CPU")


class BlockListener(Protocol):
    """Receives a cache's block changes (module docstring); must not call back into the cache."""

    def stored(
        self, key: Hashable, parent_key: Hashable | None, token_ids: Sequence[int], medium: str
    ) -> None: ...

    def removed(self, key: Hashable, medium: str) -> None: ...

    def cleared(self) -> None: ...


def token_ids_of(token_bytes: bytes) -> tuple[int, ...]:
    """The token ids of fixed-width block bytes (4 bytes per id, little-endian:
    :func:`kvbench.cache.block_hash.encode_token_ids`)."""
    return struct.unpack(f"<{len(token_bytes) // 4}I", token_bytes)
