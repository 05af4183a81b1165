"""What each request should find cached behind a router: ``kvbench route``'s model of the router's
policy over N replicas, each with its own prefix cache.

One cache's expectation (:func:`kvbench.backends.openai.reconcile.expect`) is wrong for a fleet: under
round robin a conversation's next turn lands on another replica, finds nothing of its earlier turns
there, and a correct server looks like it lost blocks. Here the requests are routed one at a time, in
the order they are sent, by the named router's model; each replica's hits are a single-cache replay of
the requests it received (:func:`kvbench.route.cluster.simulate_cluster`). That is the fleet a client
at concurrency 1 drives exactly; at higher concurrency the real router sees loads and an order the
model does not, so the expectation is an approximation there.

The real routers' policy names map to the models ``kvbench route`` has (:data:`ROUTER_POLICIES`;
``kv_aware`` reads each simulated replica's cache through its block events, as the router reads its
workers' KV events); a policy without a model (``random``, ``power_of_two``: their picks are random)
gets no fleet expectation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvbench.cache.base import CacheConfig
from kvbench.request import Request
from kvbench.route.api import RouterOptions, make_router, needs_tokens
from kvbench.route.cluster import ClusterConfig, prepare_route_trace, simulate_cluster
from kvbench.route.policies import PolicyName

# the real routers' --policy names (sglang-router 0.3.2, vllm-router 0.1.17) -> kvbench route's model
ROUTER_POLICIES: dict[str, PolicyName] = {
    "round_robin": PolicyName.ROUND_ROBIN,
    "cache_aware": PolicyName.SGLANG_CACHE_AWARE,  # vllm-router's: name vllm_cache_aware
    "consistent_hash": PolicyName.CONSISTENT_HASH,
    "kv_aware": PolicyName.KV_AWARE,  # vllm-router's, on its workers' KV cache events
}
# the policies the routers have that kvbench route has no model of (random picks among them)
UNMODELLED = ("random", "power_of_two", "sticky_least_loaded", "manual")
SPACING_S = 1e6  # requests routed one at a time: each finishes long before the next arrives


@dataclass(frozen=True)
class FleetExpectation:
    """Per request, in the order given: the replica the model routes it to (0-based, in the order of
    the replicas' URLs up to a relabelling: replicas are identical, so any relabelling gives the same
    hits) and the cached tokens it should report there."""

    policy: str
    model: str
    num_replicas: int
    replica: list[int]
    cached_tokens: list[int]


def model_of(policy: str) -> PolicyName | None:
    """``kvbench route``'s model of a router's ``--policy`` (a router's name, or one of ``kvbench
    route``'s), or ``None`` for a router policy it has no model of.

    Raises:
        ValueError: ``policy`` is neither a router's policy nor one of ``kvbench route``'s.
    """
    name = policy.strip()
    if name in ROUTER_POLICIES:
        return ROUTER_POLICIES[name]
    if name in UNMODELLED:
        return None
    for model in PolicyName:
        if model.value == name:
            return model
    known = [*ROUTER_POLICIES, *UNMODELLED, *(p.value for p in PolicyName)]
    raise ValueError(f"--fleet-policy {policy!r}: not a router policy (choose from {', '.join(known)})")


def fleet_expectation(
    requests: Sequence[Request],
    cache: CacheConfig,
    policy: str,
    num_replicas: int,
    worker_urls: Sequence[str] = (),
) -> FleetExpectation | None:
    """Route ``requests`` (in order) over ``num_replicas`` replicas, each with a cache built from
    ``cache``, by the model of ``policy``; ``None`` when the policy has no model. ``worker_urls``: the
    replicas as the router names them (``consistent_hash`` hashes them onto its ring), when known.

    Raises:
        ValueError: ``num_replicas`` is not positive.
    """
    model = model_of(policy)
    if model is None:
        return None
    spaced = [replace(r, arrival_s=i * SPACING_S) for i, r in enumerate(requests)]
    trace = prepare_route_trace(spaced, cache, top_prefixes=0, keep_tokens=needs_tokens([model]))
    urls = tuple(worker_urls) if len(worker_urls) == num_replicas else None
    router = make_router(model, num_replicas, cache.block_size, RouterOptions(worker_urls=urls))
    run = simulate_cluster(trace, router, ClusterConfig(num_replicas, cache))
    return FleetExpectation(
        policy, model.value, num_replicas, run.replica.tolist(), [int(t) for t in run.cached_tokens]
    )
