"""The host tier's index: which block keys a second, larger KV pool holds, in LRU order (pure Python).

The paged engine's optional host tier (``--host-tier``) is *inclusive* (write-through), the policy
:mod:`kvbench.sim.tiers` models and vLLM's ``OffloadingConnector`` follows: every keyed block a
sequence releases is stored in (or refreshed at) the tier, the sequence's last block first, so its
block 0 ends most recent (the GPU free queue's tail-first order); a GPU miss continues the lookup in
the tier and loads the hits back into GPU blocks. At concurrency 1 the tier then holds the
``capacity_blocks`` most recently used blocks of the stack, as the simulator's inclusive tier does.

The index hands out *slots* ``0 .. capacity_blocks - 1``; the engine owns the tensors they address.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from kvbench.cache.events import MEDIUM_CPU, BlockListener


class HostTierIndex:
    """Slots of a host KV tier keyed by block key, least recently used first.

    Raises (constructor): ``ValueError`` for a non-positive capacity.
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"a host tier needs a positive capacity, got {capacity_blocks} blocks")
        self.capacity_blocks = capacity_blocks
        self._slots: OrderedDict[Hashable, int] = OrderedDict()
        self._free = list(range(capacity_blocks - 1, -1, -1))  # pop() hands out slot 0 first
        self.num_stored_blocks = 0  # blocks copied in over the tier's life
        self.num_evicted_blocks = 0
        self.listener: BlockListener | None = None  # told every store and drop (cache/events.py)

    def __len__(self) -> int:
        return len(self._slots)

    def cached_prefix(self, keys: Sequence[Hashable]) -> list[int]:
        """Slots of the longest leading run of ``keys`` the tier holds (no order change)."""
        slots = []
        for key in keys:
            slot = self._slots.get(key)
            if slot is None:
                break
            slots.append(slot)
        return slots

    def store(
        self, key: Hashable, parent_key: Hashable | None = None, token_ids: Sequence[int] = ()
    ) -> int | None:
        """Make ``key`` the most recent; returns the slot to copy its K/V into, or ``None`` when the
        tier holds it already (refreshed, nothing to copy). A full tier drops its least recent key.
        ``parent_key`` and ``token_ids`` (the block's) are only read for the listener."""
        if key in self._slots:
            self._slots.move_to_end(key)
            return None
        if self._free:
            slot = self._free.pop()
        else:
            dropped, slot = self._slots.popitem(last=False)
            self.num_evicted_blocks += 1
            if self.listener is not None:
                self.listener.removed(dropped, MEDIUM_CPU)
        self._slots[key] = slot
        self.num_stored_blocks += 1
        if self.listener is not None:
            self.listener.stored(key, parent_key, token_ids, MEDIUM_CPU)
        return slot

    def held_keys(self) -> list[Hashable]:
        """The keys the tier holds, least recent first."""
        return list(self._slots)

    def clear(self) -> None:
        """Forget every key (``reset_prefix_cache``)."""
        if self.listener is not None:
            for key in self._slots:
                self.listener.removed(key, MEDIUM_CPU)
        self._slots.clear()
        self._free = list(range(self.capacity_blocks - 1, -1, -1))

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless every slot is either free or held by exactly one key."""
        held = list(self._slots.values())
        if (
            len(set(held)) != len(held)
            or set(held) & set(self._free)
            or len(held) + len(self._free) != self.capacity_blocks
        ):
            raise AssertionError(f"host tier slots inconsistent: {len(held)} held, {len(self._free)} free")
