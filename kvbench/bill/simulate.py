"""A provider's prompt cache simulated on a trace's timestamps (TTL in trace time): per request, the
usage the provider would report.

**Anthropic** (https://platform.claude.com/docs/en/build-with-claude/prompt-caching): a cache entry
is the prefix up to a ``cache_control`` breakpoint, written only when that prefix has at least the
model's minimum length. A request reads the longest live entry found at its breakpoints or at the
content-block boundaries up to 20 before each breakpoint (the documented lookback); the read
refreshes that entry's TTL. Every cacheable breakpoint past the read creates an entry, and
``cache_creation_input_tokens`` is from the read to the last cacheable breakpoint.
``input_tokens`` is the rest.

**OpenAI** (https://developers.openai.com/api/docs/guides/prompt-caching): automatic. The prompt is
cut into 128-token increments and replayed through kvbench's own hash cache (unbounded, idle TTL
= the retention; one :func:`kvbench.sim.step.step` per request), so a hit is the longest cached
prefix in 128-token steps, counted only from 1,024 tokens; prompts shorter than 1,024 tokens are
neither read nor cached. Writes have no premium. Not simulated: OpenAI's routing of one prefix across
machines above ~15 requests per minute, and the one-hour cap of in-memory retention.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.bill.placement import Marked
from kvbench.bill.rules import CacheRules, Provider
from kvbench.cache.base import CacheConfig
from kvbench.cache.block_hash import BlockHasher
from kvbench.cache.hash_cache import HashPrefixCache
from kvbench.sim.step import step

LOOKBACK_BLOCKS = 20  # Anthropic checks about 20 content blocks before each breakpoint


@dataclass(frozen=True)
class Usage:
    """One request's usage as the provider reports it (Anthropic's field names; for OpenAI,
    ``cache_read_input_tokens`` is ``cached_tokens`` and writes are billed at the input price).
    ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens`` = prompt tokens."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


def _digest(marked: Marked, length: int) -> bytes:
    return hashlib.sha256(marked.token_ids[:length].astype("<u4").tobytes()).digest()


def _candidates(marked: Marked) -> list[int]:
    """Offsets a read may land on, longest first: the breakpoints, and up to 20 boundaries before each."""
    offsets = set(marked.breakpoints)
    for breakpoint_ in marked.breakpoints:
        before = [b for b in marked.boundaries if b < breakpoint_]
        offsets.update(before[-LOOKBACK_BLOCKS:])
    return (
        sorted((o for o in offsets if o <= marked.breakpoints[-1]), reverse=True)
        if marked.breakpoints
        else []
    )


def simulate_anthropic(requests: Sequence[Marked], rules: CacheRules) -> list[Usage]:
    """Usage per request (arrival order as given); see the module docstring."""
    expiry_s: dict[bytes, float] = {}  # entry (digest of its prefix) -> when it expires
    usages = []
    for marked in requests:
        now = marked.arrival_s
        read = 0
        for offset in _candidates(marked):
            key = _digest(marked, offset)
            if offset >= rules.min_cacheable_tokens and expiry_s.get(key, -1.0) > now:
                read, expiry_s[key] = offset, now + rules.ttl_s  # a read refreshes the entry
                break
        cacheable = [b for b in marked.breakpoints if b >= rules.min_cacheable_tokens and b > read]
        for offset in cacheable:
            expiry_s[_digest(marked, offset)] = now + rules.ttl_s
        written = cacheable[-1] - read if cacheable else 0
        usages.append(Usage(marked.num_tokens - read - written, written, read, marked.output_tokens))
    return usages


def simulate_openai(requests: Sequence[Marked], rules: CacheRules) -> list[Usage]:
    """Usage per request (arrival order as given); see the module docstring."""
    increment = rules.increment_tokens or 128
    now = [0.0]
    total_blocks = sum(m.num_tokens // increment for m in requests) + 1
    cache = HashPrefixCache(
        CacheConfig(capacity_blocks=total_blocks, block_size=increment, ttl_s=rules.ttl_s),
        clock=lambda: now[0],
    )
    hasher = BlockHasher(increment)
    usages = []
    for marked in requests:
        now[0] = marked.arrival_s
        if marked.num_tokens < rules.min_cacheable_tokens:
            usages.append(Usage(marked.num_tokens, 0, 0, marked.output_tokens))
            continue
        done = step(cache, hasher.prompt_blocks(marked.token_ids))
        read = done.num_hit_tokens if done.num_hit_tokens >= rules.min_cacheable_tokens else 0
        written = done.num_inserted_blocks * increment
        usages.append(Usage(marked.num_tokens - read - written, written, read, marked.output_tokens))
    return usages


def simulate(requests: Sequence[Marked], rules: CacheRules) -> list[Usage]:
    """The provider's semantics (``rules.provider``), requests sorted by arrival (stable)."""
    ordered = sorted(requests, key=lambda m: m.arrival_s)
    return {Provider.ANTHROPIC: simulate_anthropic, Provider.OPENAI: simulate_openai}[rules.provider](
        ordered, rules
    )
