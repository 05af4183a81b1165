"""What every prefix cache shares: its config, its counters, its result objects and its protocol.

Two implementations follow :class:`PrefixCache`: ``HashPrefixCache`` (a hash table of chained block
keys with a free list, after vLLM v1's ``BlockPool``) and ``RadixPrefixCache`` (a radix tree of
token runs, after SGLang's ``RadixCache``). ``make_cache`` picks one by kind from a literal mapping.

A request's life in any cache::

    match = cache.lookup(prompt, prompt.max_hit_blocks)   # pins the hit blocks
    ...compute the blocks after match.num_hit_blocks...
    new = cache.insert(prompt, match.num_hit_blocks, payloads)   # pins what it stored
    cache.release(match.handles + new.handles)             # always, in a finally:
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from kvbench.cache.block_hash import HashConfig, PromptBlocks

Clock = Callable[[], float]  # returns seconds; injectable so TTL tests need no sleeping


HEAD_FIRST_RADIX_ERROR = (
    "the radix cache evicts leaves only, so a chain head can never go before its "
    "tail: head-first release exists only for the hash cache"
)


class ReleaseOrder(str, Enum):
    """Order in which a finished request's blocks join the free list.

    ``tail-first`` (vLLM's order) puts a chain's last block on the free list first, so it is evicted
    before its head; evicting a head first would orphan every block after it (a lookup stops at the
    first miss). ``head-first`` exists only to demonstrate that bug.
    """

    TAIL_FIRST = "tail-first"
    HEAD_FIRST = "head-first"


class CacheKind(str, Enum):
    """The two cache structures."""

    HASH = "hash"
    RADIX = "radix"


@dataclass(frozen=True)
class CacheConfig:
    """Settings of one prefix cache.

    Attributes:
        capacity_blocks: most blocks held at once (pinned or not); positive.
        block_size: tokens per block; positive (16 is vLLM's default, 64 the coarse option).
        kind: hash table or radix tree.
        ttl_s: unpinned blocks idle for longer than this many seconds expire; ``None`` = never.
        release_order: see :class:`ReleaseOrder`.
        verify_tokens: on a key hit, also compare the stored token ids (nano-vllm's guard); off by
            default, as in vLLM, so that a truncated hash can show what a collision does.
        hash: how block keys are computed (algorithm and width).
        prompt_only: cache the prompt's full blocks only (kvbench's rule before it cached output blocks).
            Off by default: an engine caches every full block of prompt + output - 1 tokens (the last
            sampled token has no KV yet), keys chained over the generated ids, as vLLM v1 does (its
            block pool hashes a block as soon as decode fills it, ``BlockPool.cache_full_blocks``), so
            the next turn of a chat that resends the reply hits it. The cache classes ignore it; the engine
            and the simulators read it.

    Raises:
        ValueError: a non-positive capacity or block size, a bad TTL, or head-first release with the
            radix kind (its eviction takes leaves only: :data:`HEAD_FIRST_RADIX_ERROR`).
    """

    capacity_blocks: int
    block_size: int = 16  # vLLM's default block size
    kind: CacheKind = CacheKind.HASH
    ttl_s: float | None = None
    release_order: ReleaseOrder = ReleaseOrder.TAIL_FIRST
    verify_tokens: bool = False  # vLLM trusts the key; nano-vllm compares tokens
    hash: HashConfig = field(default_factory=HashConfig)
    prompt_only: bool = False  # False: generated blocks are cached too (vLLM v1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CacheKind(self.kind))
        object.__setattr__(self, "release_order", ReleaseOrder(self.release_order))
        if not isinstance(self.capacity_blocks, int) or self.capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be a positive integer, got {self.capacity_blocks}")
        if not isinstance(self.block_size, int) or self.block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size}")
        if self.ttl_s is not None and not (self.ttl_s > 0 and math.isfinite(self.ttl_s)):
            raise ValueError(f"ttl_s must be a positive number of seconds or None, got {self.ttl_s}")
        if self.kind is CacheKind.RADIX and self.release_order is not ReleaseOrder.TAIL_FIRST:
            raise ValueError(f"--cache-kind radix --release head-first: {HEAD_FIRST_RADIX_ERROR}")


@dataclass
class CacheStats:
    """Running counters of one cache. Tokens are ``blocks x block_size``.

    Attributes:
        num_lookups: lookup calls.
        num_queried_blocks: blocks lookups were allowed to hit (sum of the caps).
        num_hit_blocks: blocks returned by lookups.
        num_inserted_blocks: blocks newly stored by insert.
        num_refused_blocks: blocks insert could not store because every block was pinned.
        num_evicted_blocks: unpinned blocks dropped to make room.
        num_expired_blocks: unpinned blocks dropped because their TTL ran out.
        num_rejected_hits: key hits whose stored tokens differed (only with ``verify_tokens``).
    """

    block_size: int
    num_lookups: int = 0
    num_queried_blocks: int = 0
    num_hit_blocks: int = 0
    num_inserted_blocks: int = 0
    num_refused_blocks: int = 0
    num_evicted_blocks: int = 0
    num_expired_blocks: int = 0
    num_rejected_hits: int = 0

    @property
    def num_miss_blocks(self) -> int:
        return self.num_queried_blocks - self.num_hit_blocks

    @property
    def num_hit_tokens(self) -> int:
        return self.num_hit_blocks * self.block_size

    @property
    def block_hit_rate(self) -> float:
        """Hit blocks / blocks lookups were allowed to hit (0 when nothing was queried)."""
        return self.num_hit_blocks / self.num_queried_blocks if self.num_queried_blocks else 0.0


class MatchResult:
    """What a lookup found: the longest cached prefix, pinned.

    Attributes:
        num_hit_blocks: length of the hit, in blocks, from block 0.
        handles: pass these to ``release`` exactly once.
        num_expired_blocks: blocks the lookup's TTL sweep dropped first.
        payloads: one stored payload per hit block, in block order (built on first access, so the
            simulator, which stores no payloads, never pays for the list). Read it before
            ``release``: a released block may be evicted and reused for another key.
    """

    __slots__ = ("num_hit_blocks", "handles", "num_expired_blocks", "_payloads", "_payloads_of")

    def __init__(
        self,
        num_hit_blocks: int,
        handles: list[Any],
        payloads_of: Callable[[list[Any], int], list[Any]],
        num_expired_blocks: int = 0,
    ) -> None:
        self.num_hit_blocks = num_hit_blocks
        self.handles = handles
        self.num_expired_blocks = num_expired_blocks
        self._payloads_of = payloads_of
        self._payloads: list[Any] | None = None

    @property
    def payloads(self) -> list[Any]:
        if self._payloads is None:
            self._payloads = self._payloads_of(self.handles, self.num_hit_blocks)
        return self._payloads


@dataclass
class InsertResult:
    """What an insert stored. Falsy when it stored nothing new.

    Attributes:
        num_inserted_blocks: blocks newly stored (pinned for the caller).
        num_existing_blocks: blocks that were already cached (another request stored them) and are
            now pinned for the caller instead.
        num_refused_blocks: blocks that could not be stored because everything else was pinned.
        handles: pass these to ``release`` exactly once.
        num_evicted_blocks: unpinned blocks this insert dropped to make room (LRU, a chain's tail
            first); the cache's ``stats.num_evicted_blocks`` grew by as much.
    """

    num_inserted_blocks: int
    num_existing_blocks: int
    num_refused_blocks: int
    handles: list[Any]
    num_evicted_blocks: int = 0

    def __bool__(self) -> bool:
        return self.num_inserted_blocks > 0


class PrefixCache(Protocol):
    """The contract both caches implement (tested by one suite parametrized over both).

    * ``lookup`` sweeps expired blocks, then returns the longest cached prefix of ``prompt``,
      stopping at the first miss and at ``max_hit_blocks``; every returned block is pinned
      (ref count + 1, off the free list) and its idle timer restarts.
    * ``insert`` stores blocks ``start_block ..`` of ``prompt`` pinned, evicting unpinned blocks
      (LRU, a chain's tail before its head) until there is room; it never evicts a pinned block and
      refuses what does not fit.
    * ``release`` unpins; blocks reaching ref count 0 become evictable and their idle timer starts.
    """

    config: CacheConfig
    stats: CacheStats

    @property
    def num_cached_blocks(self) -> int: ...

    @property
    def num_evictable_blocks(self) -> int: ...

    def lookup(self, prompt: PromptBlocks, max_hit_blocks: int | None = None) -> MatchResult: ...

    def insert(
        self,
        prompt: PromptBlocks,
        start_block: int,
        payloads: Sequence[Any] | None = None,
        stop_block: int | None = None,
    ) -> InsertResult: ...

    def release(self, handles: Sequence[Any]) -> None: ...

    def sweep(self) -> int: ...

    def reset(self) -> None: ...

    def check_invariants(self) -> None: ...


def insert_range(
    prompt: PromptBlocks, start_block: int, payloads: Sequence[Any] | None, stop_block: int | None
) -> tuple[int, int]:
    """Validate an insert's block range; returns ``(start, stop)``. Raises ``ValueError``."""
    stop = prompt.num_full_blocks if stop_block is None else stop_block
    if not 0 <= start_block <= stop <= prompt.num_full_blocks:
        raise ValueError(
            f"insert range [{start_block}, {stop}) outside the prompt's {prompt.num_full_blocks} blocks"
        )
    if payloads is not None and len(payloads) != stop - start_block:
        raise ValueError(f"got {len(payloads)} payloads for {stop - start_block} blocks")
    return start_block, stop


def make_cache(config: CacheConfig, clock: Clock | None = None) -> PrefixCache:
    """Build the cache ``config.kind`` names (a literal mapping; the implementations import this
    module, so they are imported here). Raises ``ValueError`` for an unsupported setting."""
    from kvbench.cache.hash_cache import HashPrefixCache
    from kvbench.cache.radix_cache import RadixPrefixCache

    classes: dict[CacheKind, Callable[..., PrefixCache]] = {
        CacheKind.HASH: HashPrefixCache,
        CacheKind.RADIX: RadixPrefixCache,
    }
    return classes[config.kind](config, clock=clock)
