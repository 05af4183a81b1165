"""Build routers by name and compare policies on one trace: the library call behind ``kvbench route``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.route.cache_aware import CacheAware, CacheAwareConfig
from kvbench.route.cluster import ClusterConfig, RouteTrace, simulate_cluster
from kvbench.route.kv_aware import KvAware
from kvbench.route.policies import (
    ConsistentHash,
    LeastLoaded,
    PolicyName,
    PowerOfTwo,
    PrefixHashBounded,
    RandomChoice,
    RoundRobin,
    Router,
    SessionHash,
)
from kvbench.route.real_routers import SglangCacheAware, VllmCacheAware
from kvbench.route.result import PolicyResult

PREFIX_TOKENS = 256  # OpenAI routes on about the first 256 tokens (../shared/REFERENCES.md section 6)


@dataclass(frozen=True)
class RouterOptions:
    """Knobs of the policies that have them.

    Attributes:
        prefix_tokens: ``prefix-hash`` hashes the first ``max(1, prefix_tokens // block_size)`` blocks.
        epsilon: ``prefix-hash``'s load bound ``ceil((1 + epsilon) x average)``.
        seed: ``random``'s and ``power_of_two``'s seed.
        cache_aware: the SGLang router's thresholds (also ``sglang_cache_aware``'s, whose tree size
            counts characters, and ``vllm_cache_aware``'s, counting tokens).
        worker_urls: ``consistent_hash``'s worker names, one per replica; ``None`` =
            ``http://replica-{i}``. The real router's URLs reproduce its ring.
    """

    prefix_tokens: int = PREFIX_TOKENS
    epsilon: float = 0.25
    seed: int = 0
    cache_aware: CacheAwareConfig = field(default_factory=CacheAwareConfig)
    worker_urls: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.prefix_tokens <= 0:
            raise ValueError(f"prefix_tokens must be positive, got {self.prefix_tokens}")
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be positive, got {self.epsilon}")


def worker_urls(num_replicas: int, options: RouterOptions) -> tuple[str, ...]:
    """``options.worker_urls``, else ``http://replica-{i}``. Raises ``ValueError`` for a count that
    differs from ``num_replicas``."""
    urls = options.worker_urls or tuple(f"http://replica-{i}" for i in range(num_replicas))
    if len(urls) != num_replicas:
        raise ValueError(f"worker_urls names {len(urls)} workers for {num_replicas} replicas")
    return urls


def make_router(
    policy: PolicyName | str, num_replicas: int, block_size: int, options: RouterOptions = RouterOptions()
) -> Router:
    """A fresh router for ``policy`` (a literal mapping). Raises ``ValueError`` for an unknown name."""
    builders: dict[PolicyName, Callable[[], Router]] = {
        PolicyName.ROUND_ROBIN: lambda: RoundRobin(num_replicas),
        PolicyName.RANDOM: lambda: RandomChoice(num_replicas, options.seed),
        PolicyName.LEAST_LOADED: LeastLoaded,
        PolicyName.SESSION: lambda: SessionHash(num_replicas),
        PolicyName.PREFIX_HASH: lambda: PrefixHashBounded(
            num_replicas, max(1, options.prefix_tokens // block_size), options.epsilon
        ),
        PolicyName.CACHE_AWARE: lambda: CacheAware(num_replicas, block_size, options.cache_aware),
        PolicyName.SGLANG_CACHE_AWARE: lambda: SglangCacheAware(num_replicas, options.cache_aware),
        PolicyName.VLLM_CACHE_AWARE: lambda: VllmCacheAware(num_replicas, options.cache_aware),
        PolicyName.CONSISTENT_HASH: lambda: ConsistentHash(worker_urls(num_replicas, options)),
        PolicyName.POWER_OF_TWO: lambda: PowerOfTwo(num_replicas, options.seed),
        PolicyName.KV_AWARE: lambda: KvAware(num_replicas, block_size),
    }
    return builders[PolicyName(policy)]()


READS_CACHES = (PolicyName.KV_AWARE,)  # policies that read the simulated replicas' caches (attach)


def policies_for(cache: CacheConfig) -> list[PolicyName]:
    """Every policy that can route over replicas with ``cache``: ``kv_aware`` reads the caches' block
    events, which the radix cache does not publish."""
    return [p for p in PolicyName if p not in READS_CACHES or cache.kind is CacheKind.HASH]


def needs_tokens(policies: Sequence[PolicyName | str]) -> bool:
    """Whether a trace routed by ``policies`` must keep its blocks' token ids
    (:func:`~kvbench.route.cluster.prepare_route_trace`'s ``keep_tokens``)."""
    return any(PolicyName(p) in READS_CACHES for p in policies)


def compare_policies(
    trace: RouteTrace,
    config: ClusterConfig,
    policies: Sequence[PolicyName | str],
    options: RouterOptions = RouterOptions(),
    progress: Callable[[PolicyResult], None] | None = None,
) -> list[PolicyResult]:
    """One :func:`simulate_cluster` per policy, each with fresh replicas and a fresh router, in order."""
    results = []
    for policy in policies:
        router = make_router(policy, config.num_replicas, trace.block_size, options)
        run = simulate_cluster(trace, router, config)
        decisions = getattr(router, "decisions", None)
        decisions = dict(decisions) if decisions is not None else None
        results.append(PolicyResult(PolicyName(policy).value, run, decisions))
        if progress is not None:
            progress(results[-1])
    return results
