"""What Anthropic's prompt cache would report for a ``/v1/messages`` request.

``/v1/messages`` is a test double for Anthropic's API, so its usage follows Anthropic's caching
rules (platform.claude.com "Prompt caching"; ../shared/REFERENCES.md section 6), not the engine's
block cache:

* a prefix is cached only at a **breakpoint**: a block's ``cache_control`` (the end of the message
  holding it here, messages being one ChatML segment each) or the top-level ``cache_control``
  (automatic caching: the last block); at most :data:`MAX_BREAKPOINTS`;
* a breakpoint shorter than the **minimum cacheable length** (``min_cache_tokens``; 1,024 as for
  Claude Sonnet) caches nothing;
* a **read** is the longest cached prefix that ends at one of the request's breakpoints or at a
  message boundary up to :data:`LOOKBACK_BLOCKS` messages before one (Anthropic looks back about
  20 blocks); it never runs past the last breakpoint;
* a **write** (``cache_creation_input_tokens``) is every token from the read to the last breakpoint;
  each breakpoint's prefix is then cached for its TTL (``"5m"`` default, ``"1h"``), refreshed on a read;
* ``input_tokens`` is the rest (after the last breakpoint, or all of it with none).

The engine's own prefix cache is unchanged and still reported: ``kvbench:prefix_cache_hits_total``
at /metrics and, on a whole response, the ``x-kvbench-cached-tokens`` header.
"""

from __future__ import annotations

import collections
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MAX_BREAKPOINTS = 4  # Anthropic: at most 4 blocks with cache_control per request
LOOKBACK_BLOCKS = 20  # Anthropic checks about 20 block boundaries before each breakpoint for a hit
TTL_S = {"5m": 300.0, "1h": 3600.0}  # cache_control.ttl values; 5 minutes by default
MAX_ENTRIES = 100_000  # cached prefixes kept at most (the oldest dropped first): bounded memory


@dataclass(frozen=True)
class Breakpoint:
    """A cache breakpoint: the prefix of ``end_tokens`` tokens, cached for ``ttl_s`` seconds."""

    end_tokens: int
    ttl_s: float = TTL_S["5m"]


@dataclass(frozen=True)
class CacheUsage:
    """Anthropic's three input counts of one request (they sum to its prompt tokens)."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class BreakpointCache:
    """Cached prefixes (their SHA-256 over the token ids) with expiry times; one per server.

    Args:
        min_cache_tokens: the shortest prefix a breakpoint caches (positive).
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(self, min_cache_tokens: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_cache_tokens, self.clock = min_cache_tokens, clock
        self._expiry: collections.OrderedDict[bytes, float] = collections.OrderedDict()

    def clear(self) -> None:
        """Forget every cached prefix (``/reset_prefix_cache``)."""
        self._expiry.clear()

    def account(
        self, token_ids: np.ndarray, breakpoints: Sequence[Breakpoint], boundaries: Sequence[int]
    ) -> CacheUsage:
        """Read and write ``token_ids``'s prefixes at ``breakpoints`` (the module docstring's rules);
        ``boundaries`` are the message ends (tokens) a read may also stop at."""
        num_tokens = int(token_ids.shape[0])
        cacheable = sorted(
            (b for b in breakpoints if b.end_tokens >= self.min_cache_tokens), key=lambda b: b.end_tokens
        )
        if not cacheable:
            return CacheUsage(num_tokens, 0, 0)
        last = cacheable[-1].end_tokens
        ends = {b.end_tokens for b in cacheable} | {
            end for end in _lookback(boundaries, cacheable) if self.min_cache_tokens <= end <= last
        }
        keys = _prefix_keys(token_ids, sorted(ends))
        now, ttl_of = self.clock(), {b.end_tokens: b.ttl_s for b in cacheable}
        read = next((end for end in sorted(ends, reverse=True) if self._expiry.get(keys[end], 0.0) > now), 0)
        if read:
            self._store(keys[read], now + ttl_of.get(read, TTL_S["5m"]))  # a hit refreshes its TTL
        for breakpoint in cacheable:
            if breakpoint.end_tokens > read:
                self._store(keys[breakpoint.end_tokens], now + breakpoint.ttl_s)
        created = last - read
        return CacheUsage(num_tokens - read - created, created, read)

    def _store(self, key: bytes, expiry_s: float) -> None:
        self._expiry[key] = max(expiry_s, self._expiry.get(key, 0.0))
        self._expiry.move_to_end(key)
        while len(self._expiry) > MAX_ENTRIES:
            self._expiry.popitem(last=False)


def _lookback(boundaries: Sequence[int], breakpoints: Sequence[Breakpoint]) -> set[int]:
    """The message ends at most :data:`LOOKBACK_BLOCKS` before each breakpoint."""
    found: set[int] = set()
    ordered = sorted(boundaries)
    for breakpoint in breakpoints:
        before = [end for end in ordered if end < breakpoint.end_tokens]
        found.update(before[-LOOKBACK_BLOCKS:])
    return found


def _prefix_keys(token_ids: np.ndarray, ends: Sequence[int]) -> dict[int, bytes]:
    """SHA-256 of each prefix ``token_ids[:end]`` (``ends`` ascending), one pass over the ids."""
    ids = np.ascontiguousarray(token_ids, dtype=np.uint32)
    digest, start, keys = hashlib.sha256(), 0, {}
    for end in ends:
        digest.update(ids[start:end].tobytes())
        keys[end], start = digest.copy().digest(), end
    return keys
