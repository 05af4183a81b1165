"""SGLang's cache-aware router (sgl-model-gateway ``policies/cache_aware.rs``), over block keys.

The router keeps an approximate radix tree of what it *sent* each replica (the replicas are the
tree's tenants); it never asks a replica what it holds. Per request:

1. The system is imbalanced when ``max load - min load > balance_abs_threshold`` **and**
   ``max load > min load x balance_rel_threshold`` (loads = requests in flight). Then the request
   goes to the shortest queue, and the tree still records it.
2. Otherwise find the tenant with the longest prefix match; ``match rate = matched tokens / prompt
   tokens``. Above ``cache_threshold`` the request goes to that tenant; at or below it, to the
   tenant with the smallest tree (the most free cache, as the router's source does it; some
   descriptions say "least loaded").
3. The chosen tenant's tree gets the prompt. Every ``eviction_interval_s`` (trace time) each
   tenant's tree is trimmed to ``max_tree_size_tokens`` by evicting its least recently used leaves.

Differences from SGLang, on purpose: the tree here is over the prompt's chained block keys
(``block_size`` tokens per edge step) instead of request text characters, so sizes are tokens of
full blocks and the partial tail is not recorded. A chained key names its whole prefix, so "tenant
holds key i" implies it was sent blocks 0..i, which is what a radix path means.

Defaults are the router's CLI defaults (RouterArgs, ../shared/REFERENCES.md section 2):
cache_threshold 0.3, balance thresholds 64 and 1.5, eviction every 120 s, max tree size 2^26.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.cache.block_hash import BlockHash, PromptBlocks
from kvbench.route.policies import RequestView, least_loaded


@dataclass(frozen=True)
class CacheAwareConfig:
    """The router's knobs (CLI defaults of SGLang's RouterArgs; the library defaults are 0.5, 32, 1.1,
    30 s and 10,000). Raises ``ValueError`` for out-of-range values."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_size_tokens: int = 2**26

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold}")
        if self.balance_rel_threshold < 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold}")
        if not self.eviction_interval_s > 0:
            raise ValueError(f"eviction_interval_s must be positive, got {self.eviction_interval_s}")
        if self.max_tree_size_tokens <= 0:
            raise ValueError(f"max_tree_size_tokens must be positive, got {self.max_tree_size_tokens}")


def is_imbalanced(loads: Sequence[int], config: CacheAwareConfig) -> bool:
    """SGLang's test: both the absolute and the relative thresholds are exceeded."""
    high, low = max(loads), min(loads)
    return high - low > config.balance_abs_threshold and high > low * config.balance_rel_threshold


class ApproximateTree:
    """Per tenant, the block keys it was sent with their last access time (s) and depth."""

    def __init__(self, num_tenants: int) -> None:
        self.owners: dict[BlockHash, dict[int, float]] = {}
        self.depth: dict[BlockHash, int] = {}
        self.size_blocks = [0] * num_tenants

    def match(self, prompt: PromptBlocks, loads: Sequence[int]) -> tuple[int, int]:
        """``(tenant, matched blocks)`` of the longest match; ties go to the lower load, then index."""
        candidates: set[int] | None = None
        matched = 0
        for key in prompt.block_hashes:
            holders = self.owners.get(key)
            if not holders:
                break
            survivors = set(holders) if candidates is None else candidates & holders.keys()
            if not survivors:
                break
            candidates, matched = survivors, matched + 1
        if not candidates:
            return least_loaded(loads), 0
        return min(candidates, key=lambda t: (loads[t], t)), matched

    def insert(self, prompt: PromptBlocks, tenant: int, now_s: float) -> None:
        for depth, key in enumerate(prompt.block_hashes):
            holders = self.owners.setdefault(key, {})
            if tenant not in holders:
                self.size_blocks[tenant] += 1
            holders[tenant] = now_s
            self.depth[key] = depth

    def evict(self, tenant: int, max_blocks: int) -> int:
        """Drop ``tenant``'s least recently used keys (deepest first on ties: leaves before their
        parents) until it holds ``max_blocks``; returns how many were dropped."""
        excess = self.size_blocks[tenant] - max_blocks
        if excess <= 0:
            return 0
        held = [
            (holders[tenant], -self.depth[key], key)
            for key, holders in self.owners.items()
            if tenant in holders
        ]
        held.sort()
        for _, _, key in held[:excess]:
            del self.owners[key][tenant]
            if not self.owners[key]:
                del self.owners[key], self.depth[key]
        self.size_blocks[tenant] -= excess
        return excess

    def smallest_tenant(self) -> int:
        return min(range(len(self.size_blocks)), key=self.size_blocks.__getitem__)


class CacheAware:
    """``cache-aware``: see the module docstring. ``decisions`` counts ``balance`` / ``match`` /
    ``smallest-tree`` choices."""

    def __init__(
        self, num_replicas: int, block_size: int, config: CacheAwareConfig = CacheAwareConfig()
    ) -> None:
        self.tree, self.block_size, self.config = ApproximateTree(num_replicas), block_size, config
        self.next_eviction_s: float | None = None
        self.decisions = {"balance": 0, "match": 0, "smallest-tree": 0}

    def choose(self, request: RequestView, loads: Sequence[int]) -> int:
        self._maybe_evict(request.arrival_s)
        if is_imbalanced(loads, self.config):
            replica, why = least_loaded(loads), "balance"
        else:
            tenant, matched_blocks = self.tree.match(request.prompt, loads)
            rate = (
                matched_blocks * self.block_size / request.prompt.num_tokens
                if request.prompt.num_tokens
                else 0.0
            )
            if rate > self.config.cache_threshold:
                replica, why = tenant, "match"
            else:
                replica, why = self.tree.smallest_tenant(), "smallest-tree"
        self.decisions[why] += 1
        self.tree.insert(request.prompt, replica, request.arrival_s)
        return replica

    def _maybe_evict(self, now_s: float) -> None:
        if self.next_eviction_s is None:
            self.next_eviction_s = now_s + self.config.eviction_interval_s
        while now_s >= self.next_eviction_s:
            max_blocks = self.config.max_tree_size_tokens // self.block_size
            for tenant in range(len(self.tree.size_blocks)):
                self.tree.evict(tenant, max_blocks)
            self.next_eviction_s += self.config.eviction_interval_s
