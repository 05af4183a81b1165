"""The interactive cache of ``kvbench play``, without the screen: the seed's pool, prompts and keys.

A pool of 16 blocks of 16 tokens (a real :class:`~kvbench.cache.hash_cache.HashPrefixCache` or
:class:`~kvbench.cache.radix_cache.RadixPrefixCache`), a virtual clock and a TTL of 60 s, and the
prompts of the exercise (each ends with one tail token, so its full blocks can all hit):

* ``A`` and ``B``: two 4-block system prompts (the same ids every time);
* ``chat``: A followed by one more block per turn (turn 1 = 5 blocks, turn 2 = 6, ...);
* ``one-off``: 5 blocks never seen before nor after (``X1:0`` .. ``X1:4`` for the first).

``send`` looks a prompt up and stores its blocks, as an engine does (:func:`kvbench.sim.step.step`,
holding them); the request then runs (its blocks stay pinned) until ``finish`` releases every
running request, tail first. ``advance`` moves the clock past the TTL. Blocks get a display slot
when they appear and keep it until they leave, so evictions and expiries leave empty slots where
they were (the hash table itself has no slots).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.cache.base import CacheConfig, CacheKind, make_cache
from kvbench.cache.block_hash import BlockHasher, PromptBlocks
from kvbench.sim.step import StepResult, release_step, step

NUM_BLOCKS = 16  # the seed's pool
BLOCK_SIZE = 16
TTL_S = 60.0
PROMPT_KINDS = ("A", "B", "chat", "one-off")


@dataclass(frozen=True)
class BlockView:
    """One cached block as shown: ``owner`` prompt and block ``index`` (label ``A3``), ``ref_count``,
    ``free_position`` (0 = the next victim; ``None`` while pinned), ``hash_prefix`` (8 hex digits)."""

    slot: int
    label: str
    ref_count: int
    free_position: int | None
    hash_prefix: str


@dataclass
class Event:
    """What one key did, in one line (``kind``: send, finish, advance)."""

    kind: str
    text: str


@dataclass
class PlayState:
    """The exercise's state; ``kind`` picks the cache structure."""

    kind: CacheKind = CacheKind.HASH
    now_s: float = 0.0
    events: list[Event] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_hit_tokens: int = 0

    def __post_init__(self) -> None:
        self.kind = CacheKind(self.kind)
        self.cache = make_cache(
            CacheConfig(NUM_BLOCKS, BLOCK_SIZE, kind=self.kind, ttl_s=TTL_S), clock=lambda: self.now_s
        )
        self._hasher = BlockHasher(BLOCK_SIZE)
        self._labels: dict[bytes, str] = {}
        self._slots: dict[str, int] = {}
        self._running: list[StepResult] = []  # sent, not finished: their blocks stay pinned
        self._num_turns = self._num_one_offs = 0

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens over every request sent."""
        return self.num_hit_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    @property
    def num_running(self) -> int:
        return len(self._running)

    def send(self, prompt_kind: str) -> Event:
        """Send one prompt (``A``, ``B``, ``chat``, ``one-off``); it runs until :meth:`finish`."""
        label, ids = self._prompt(prompt_kind)
        prompt = self._blocks(label, ids)
        before = {view.label for view in self.blocks()}
        running = step(self.cache, prompt, hold=True)
        self._running.append(running)
        self.num_prompt_tokens += prompt.num_tokens
        self.num_hit_tokens += running.num_hit_tokens
        gone = sorted(before - {view.label for view in self.blocks()}, key=self._order)
        text = (
            f"{label.rstrip(':')}: hit {running.num_hit_blocks} of {prompt.num_full_blocks} blocks, "
            f"stored {running.num_inserted_blocks}"
        )
        if gone:
            text += f"; evicted {', '.join(gone)}"
        if running.new.num_refused_blocks:
            text += (
                f"; pool full: {running.new.num_refused_blocks} blocks refused, every other block is pinned "
                "(a vLLM-style scheduler could not start it)"
            )
        return self._log(Event("send", text))

    def finish(self) -> Event:
        """Release every running request (tail first): their blocks become evictable."""
        count = len(self._running)
        for running in self._running:
            release_step(self.cache, running)
        self._running.clear()
        return self._log(Event("finish", f"finished {count} request(s)"))

    def advance(self, seconds: float = TTL_S + 1) -> Event:
        """Move the clock (default: past the TTL) and drop what expired."""
        before = {view.label for view in self.blocks()}
        self.now_s += seconds
        self.cache.sweep()
        gone = sorted(before - {view.label for view in self.blocks()}, key=self._order)
        return self._log(
            Event("advance", f"+{seconds:g} s: expired {', '.join(gone) if gone else 'nothing'}")
        )

    def blocks(self) -> list[BlockView]:
        """Every cached block, by display slot (see :mod:`kvbench.cache` for the two structures)."""
        views = _hash_views(self.cache) if self.kind is CacheKind.HASH else _radix_views(self.cache)
        present = {label for label, *_ in views}
        for label in [label for label in self._slots if label not in present]:
            del self._slots[label]
        shown = []
        for label, ref_count, position, digest in views:
            if label not in self._slots:
                taken = set(self._slots.values())
                self._slots[label] = next(slot for slot in range(NUM_BLOCKS) if slot not in taken)
            shown.append(
                BlockView(self._slots[label], self._labels.get(label, label), ref_count, position, digest)
            )
        return sorted(shown, key=lambda view: view.slot)

    def _prompt(self, kind: str) -> tuple[str, np.ndarray]:
        base = {"A": 1000, "B": 2000}
        if kind in base:
            return kind, np.arange(base[kind], base[kind] + 4 * BLOCK_SIZE + 1, dtype=np.uint32)
        if kind == "chat":
            self._num_turns += 1
            turns = np.arange(5000, 5000 + self._num_turns * BLOCK_SIZE, dtype=np.uint32)
            return f"chat{self._num_turns}", np.concatenate(
                [np.arange(1000, 1064, dtype=np.uint32), turns, [7]]
            )
        if kind == "one-off":
            self._num_one_offs += 1
            start = 10_000 * (self._num_one_offs + 1)
            return f"X{self._num_one_offs}:", np.arange(start, start + 5 * BLOCK_SIZE + 1, dtype=np.uint32)
        raise ValueError(f"unknown prompt {kind!r}; expected one of {', '.join(PROMPT_KINDS)}")

    def _blocks(self, label: str, ids: np.ndarray) -> PromptBlocks:
        prompt = self._hasher.prompt_blocks(ids)
        for index, key in enumerate(prompt.block_hashes):
            path = b"".join(prompt.block_tokens[: index + 1])
            owner = "A" if index < 4 and ids[0] == 1000 else ("chat" if label.startswith("chat") else label)
            self._labels.setdefault(key, f"{owner}{index}")
            self._labels.setdefault(path, f"{owner}{index}")
        return prompt

    def _order(self, label: str) -> tuple[str, int]:
        name = self._labels.get(label, label)
        digits = len(name) - len(name.rstrip("0123456789"))
        return name[: -digits or None], int(name[-digits:]) if digits else 0

    def _log(self, event: Event) -> Event:
        self.events.append(event)
        return event


def _hash_views(cache) -> list[tuple]:
    """(identity, ref count, free-list position, hash prefix) per block of a hash cache (its table and
    free list, front = next victim)."""
    positions = {key: number for number, key in enumerate(cache._free)}
    return [(key, block.ref_count, positions.get(key), key.hex()[:8]) for key, block in cache._table.items()]


def _radix_views(cache) -> list[tuple]:
    """The same for a radix cache: every node's blocks, identified by their token path; the position is
    the eviction order (least recently used leaf first, a run's last block first)."""
    rows, stack = [], [(root, b"") for root in cache._roots.values()]
    while stack:
        node, path = stack.pop()
        for offset, block in enumerate(node.blocks):
            path += block
            rows.append((path, node.lock_ref, node, offset))
        stack.extend((child, path) for child in node.children.values())
    order = sorted((r for r in rows if r[1] == 0), key=lambda r: (r[2].last_tick, -len(r[0])))
    positions = {r[0]: number for number, r in enumerate(order)}
    return [(path, ref, positions.get(path), "-") for path, ref, _, _ in rows]
