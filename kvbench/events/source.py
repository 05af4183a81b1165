"""The listener kvbench serve attaches to its engine's prefix cache: each block change becomes a wire
event (:mod:`kvbench.events.wire`) on an :class:`~kvbench.events.publisher.EventPublisher`.

Block hashes on the wire are 64-bit integers (vLLM's default): a chained
:data:`~kvbench.cache.block_hash.BlockHash` (bytes) gives its first 8 bytes, big-endian, and any
other key (the radix pool's ``(parent, token bytes)``) its xxh3-64 digest; the same key always gives
the same integer, so a removal names what its store named.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import xxhash

from kvbench.events.publisher import EventPublisher
from kvbench.events.wire import AllBlocksCleared, BlockRemoved, BlockStored, Event


def external_hash(key: Hashable) -> int:
    """The 64-bit wire hash of a cache key (module docstring)."""
    if isinstance(key, bytes):
        return int.from_bytes(key[:8], "big")
    return xxhash.xxh3_64_intdigest(repr(key).encode())


class EventListener:
    """A :class:`~kvbench.cache.events.BlockListener` that turns every change into a wire event and
    hands it to ``emit`` (a publisher's ``publish``, or a block map's apply for a simulated cache)."""

    def __init__(self, emit: Callable[[Event], None], block_size: int) -> None:
        self.emit = emit
        self.block_size = block_size

    def stored(
        self, key: Hashable, parent_key: Hashable | None, token_ids: Sequence[int], medium: str
    ) -> None:
        parent = None if parent_key is None else external_hash(parent_key)
        tokens = tuple(map(int, token_ids))  # numpy ids (the simulator) pack as plain ints
        self.emit(BlockStored((external_hash(key),), parent, tokens, self.block_size, medium))

    def removed(self, key: Hashable, medium: str) -> None:
        self.emit(BlockRemoved((external_hash(key),), medium))

    def cleared(self) -> None:
        self.emit(AllBlocksCleared())


class PublishingListener(EventListener):
    """An :class:`EventListener` that publishes every change it is told."""

    def __init__(self, publisher: EventPublisher, block_size: int) -> None:
        super().__init__(publisher.publish, block_size)
        self.publisher = publisher
