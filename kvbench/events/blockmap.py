"""Block maps built from KV cache events: per replica what it holds, across replicas what is held twice.

A :class:`ReplicaBlocks` applies one server's batches in sequence order: ``BlockStored`` adds each
hash (per medium, counted: vLLM and the hash pool may hold one hash in two blocks, and each copy is
stored and removed on its own), ``BlockRemoved`` takes one copy away, ``AllBlocksCleared`` empties the
map. Each server hashes with its own seed (vLLM's ``PYTHONHASHSEED``-salted root, kvbench's chained
SHA-256), so two replicas name one block differently; a block's **content key** is therefore
recomputed from the events' token ids, chained like a block hash: ``xxh3_64(parent's content key,
token ids, lora name)``, the parent found through the event's ``parent_block_hash`` in the same map.
A parent the map never saw (the subscriber joined late) chains from the parent's own hash instead:
such blocks still count per replica but match no other replica (``num_orphan_blocks``).

:class:`FleetBlocks` keeps one map per replica and counts, by content key, the blocks two or more
replicas hold: ``num_duplicated_blocks`` distinct blocks, ``num_redundant_copies`` copies beyond the
first, and their bytes given ``bytes_per_block`` (a server's events do not carry its KV size).
"""

from __future__ import annotations

import struct
from collections import Counter, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import xxhash

from kvbench.events.wire import AllBlocksCleared, Batch, BlockRemoved, BlockStored

RATE_WINDOW_S = 10.0  # stores and removals per second are averaged over the last this many seconds


def content_key(parent: int | None, token_ids: tuple[int, ...], lora_name: str | None) -> int:
    """The chained content key of one block (module docstring)."""
    return _content_key(parent, struct.pack(f"<{len(token_ids)}I", *token_ids), lora_name)


def _content_key(parent: int | None, token_bytes: bytes, lora_name: str | None) -> int:
    digest = xxhash.xxh3_64()
    digest.update(struct.pack("<q", -1 if parent is None else parent - (1 << 63)))
    digest.update(token_bytes)
    if lora_name:
        digest.update(lora_name.encode())
    return digest.intdigest()


def prompt_content_keys(block_tokens: Sequence[bytes], lora_name: str | None = None) -> list[int]:
    """The content keys of a prompt's full blocks, chained from block 0 (parent ``None``), the keys a
    :class:`ReplicaBlocks` gives the same blocks when their stored events arrive. ``block_tokens``:
    per block its token ids as 4-byte little-endian unsigned integers
    (:func:`kvbench.cache.block_hash.encode_token_ids`, the events' packing)."""
    keys: list[int] = []
    parent = None
    for token_bytes in block_tokens:
        parent = _content_key(parent, token_bytes, lora_name)
        keys.append(parent)
    return keys


@dataclass(frozen=True)
class ReplicaSummary:
    """One replica now: blocks held per medium, totals since the start, per-second rates over the
    last :data:`RATE_WINDOW_S` seconds, the last sequence number applied."""

    name: str
    blocks_by_medium: dict[str, int]
    num_stored_blocks: int
    num_removed_blocks: int
    num_clears: int
    stores_per_s: float
    removals_per_s: float
    last_seq: int | None
    num_orphan_blocks: int


class ReplicaBlocks:
    """One replica's block map (module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.held: Counter[tuple[str | None, Hashable]] = Counter()  # (medium, hash) -> copies
        self._content: dict[Hashable, int] = {}  # hash -> content key, while any copy is held
        self._copies: Counter[Hashable] = Counter()  # hash -> copies over every medium
        self._by_content: Counter[int] = Counter()  # content key -> held hashes that have it
        self.num_stored_blocks = self.num_removed_blocks = self.num_clears = self.num_orphan_blocks = 0
        self.last_seq: int | None = None
        self._recent: deque[tuple[float, int, int]] = deque()  # (arrival s, stored, removed) per batch

    def apply(self, seq: int, batch: Batch, now_s: float) -> None:
        """Apply one batch (the caller keeps sequence order and drops duplicates)."""
        stored = removed = 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                stored += self._store(event)
            elif isinstance(event, BlockRemoved):
                removed += self._remove(event)
            elif isinstance(event, AllBlocksCleared):
                removed += sum(self.held.values())
                self.held.clear()
                self._content.clear()
                self._copies.clear()
                self._by_content.clear()
                self.num_clears += 1
        self.num_stored_blocks += stored
        self.num_removed_blocks += removed
        self.last_seq = seq
        self._recent.append((now_s, stored, removed))

    def _store(self, event: BlockStored) -> int:
        parent_hash, size = event.parent_block_hash, event.block_size
        parent = None if parent_hash is None else self._content.get(parent_hash)
        if parent_hash is not None and parent is None:
            parent = content_key(None, (), repr(parent_hash))
            self.num_orphan_blocks += 1
        for index, block_hash in enumerate(event.block_hashes):
            tokens = event.token_ids[index * size : (index + 1) * size]
            key = content_key(parent, tokens, event.lora_name)
            self.held[(event.medium, block_hash)] += 1
            self._copies[block_hash] += 1
            if block_hash not in self._content:
                self._content[block_hash] = key
                self._by_content[key] += 1
            parent = self._content[block_hash]
        return len(event.block_hashes)

    def _remove(self, event: BlockRemoved) -> int:
        removed = 0
        for block_hash in event.block_hashes:
            slot = (event.medium, block_hash)
            if self.held[slot] <= 0:
                del self.held[slot]
                continue  # a removal of a block stored before we joined
            removed += 1
            self.held[slot] -= 1
            if not self.held[slot]:
                del self.held[slot]
            self._copies[block_hash] -= 1
            if not self._copies[block_hash]:
                del self._copies[block_hash]
                self._forget_content(self._content.pop(block_hash))
        return removed

    def _forget_content(self, key: int) -> None:
        self._by_content[key] -= 1
        if not self._by_content[key]:
            del self._by_content[key]

    def hashes(self, medium: str | None = None) -> Counter[Hashable]:
        """Held hashes with their copy counts, of one medium or (``None``) of every medium."""
        if medium is None:
            return Counter(self._copies)
        return Counter({h: n for (m, h), n in self.held.items() if m == medium})

    def content_counts(self) -> Counter[int]:
        """Blocks held per content key, every medium and copy counted: what two maps compare block
        for block when their servers hash with different seeds."""
        counts: Counter[int] = Counter()
        for block_hash, copies in self._copies.items():
            counts[self._content[block_hash]] += copies
        return counts

    def content_keys(self) -> set[int]:
        """Content keys of every block held, any medium."""
        return set(self._by_content)

    def prefix_length(self, content_keys: Sequence[int]) -> int:
        """How many leading keys of ``content_keys`` (a prompt's chained content keys, block 0 first:
        :func:`prompt_content_keys`) this replica holds, any medium: the longest contiguous prefix,
        as vllm-router's kv_aware scores a worker. One set lookup per block, up to the first miss."""
        held = self._by_content
        for count, key in enumerate(content_keys):
            if key not in held:
                return count
        return len(content_keys)

    def summary(self, now_s: float) -> ReplicaSummary:
        recent = self._recent
        while recent and recent[0][0] < now_s - RATE_WINDOW_S:
            recent.popleft()
        span_s = max(min(RATE_WINDOW_S, now_s - recent[0][0]), 1.0) if recent else 1.0
        by_medium: Counter[str] = Counter()
        for (medium, _), copies in self.held.items():
            by_medium[medium or "?"] += copies
        return ReplicaSummary(
            self.name,
            dict(sorted(by_medium.items())),
            self.num_stored_blocks,
            self.num_removed_blocks,
            self.num_clears,
            sum(s for _, s, _ in recent) / span_s,
            sum(r for _, _, r in recent) / span_s,
            self.last_seq,
            self.num_orphan_blocks,
        )


@dataclass(frozen=True)
class FleetSummary:
    """Every replica's summary and the blocks held by two or more of them (module docstring)."""

    replicas: tuple[ReplicaSummary, ...]
    num_distinct_blocks: int
    num_duplicated_blocks: int
    num_redundant_copies: int
    redundant_bytes: int | None


class FleetBlocks:
    """One :class:`ReplicaBlocks` per replica name, created on first use."""

    def __init__(self, bytes_per_block: int | None = None) -> None:
        self.bytes_per_block = bytes_per_block
        self.replicas: dict[str, ReplicaBlocks] = {}

    def replica(self, name: str) -> ReplicaBlocks:
        if name not in self.replicas:
            self.replicas[name] = ReplicaBlocks(name)
        return self.replicas[name]

    def apply(self, name: str, seq: int, batch: Batch, now_s: float) -> None:
        self.replica(name).apply(seq, batch, now_s)

    def summary(self, now_s: float) -> FleetSummary:
        holders: Counter[int] = Counter()
        for replica in self.replicas.values():
            holders.update(replica.content_keys())
        duplicated = [n for n in holders.values() if n > 1]
        redundant = sum(n - 1 for n in duplicated)
        return FleetSummary(
            tuple(r.summary(now_s) for r in self.replicas.values()),
            len(holders),
            len(duplicated),
            redundant,
            None if self.bytes_per_block is None else redundant * self.bytes_per_block,
        )
