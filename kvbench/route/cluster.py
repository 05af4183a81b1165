"""N simulated replicas behind one router, fed from one trace in arrival order (``kvbench route``).

Each replica has its own prefix cache, built by :func:`kvbench.cache.base.make_cache` from the one
:class:`CacheConfig` (the same classes, capacity and rules as ``kvbench sim``), and its own FIFO
prefill queue timed by :class:`kvbench.route.service.ServiceModel`. Per request, in arrival order:

1. every replica's load is its requests not finished at the arrival (queued + in service);
2. the router picks a replica from the request and the loads;
3. the request's prefill starts at ``max(arrival, end of the replica's previous prefill)``; the replica's
   cache clock reads the start, and the request takes one :func:`kvbench.sim.step.step` (``lookup`` /
   ``insert`` / ``release``), as in :func:`kvbench.sim.replay.simulate` (one request at a time per
   replica, so the order of a replica's requests is its cache order);
4. the hit sets the prefill time, hence TTFT, when the replica's next prefill may start, and (with
   decode) when the request finishes and stops counting in the replica's load.

So with the same cache and no TTL, a replica's hits equal a single-cache replay of the requests it
received, in order (the tests check it).

A router that reads the replicas' caches (``kv_aware``: :mod:`kvbench.route.kv_aware`) has an
``attach(caches)`` method; it is called once with every replica's cache, in replica order, before the
first request is routed. The :class:`~kvbench.route.policies.Router` protocol stays ``choose`` alone.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.cache.base import CacheConfig, CacheKind, make_cache
from kvbench.cache.block_hash import BlockHash, PromptBlocks
from kvbench.request import Request
from kvbench.route.policies import RequestView, Router
from kvbench.route.real_routers import routing_text
from kvbench.route.service import ServiceModel
from kvbench.sim.replay import prompt_blocks_of
from kvbench.sim.step import step


@dataclass(frozen=True, eq=False)
class RouteTrace:
    """A trace hashed once for routing, in arrival order (stable).

    Attributes:
        prompts: one :class:`PromptBlocks` per request; arrivals_s: shape (num_requests,), seconds.
        session_ids: per request; output_tokens: per request (the trace's real length, else its budget).
        popular: the most shared prefixes: maximal chained keys (a longer prefix is shared by fewer
            sessions) with the number of sessions sending them, most shared first, at least 2 sessions.
        texts / token_ids: per request, what the real routers key on (:func:`routing_text`, the
            prompt's ids); ``None`` when not kept.
    """

    prompts: list[PromptBlocks]
    arrivals_s: np.ndarray
    session_ids: list[str]
    output_tokens: np.ndarray
    block_size: int
    popular: dict[BlockHash, int] = field(default_factory=dict)
    texts: list[str] | None = None
    token_ids: list[np.ndarray] | None = None

    @property
    def num_requests(self) -> int:
        return len(self.prompts)


def popular_prefixes(
    prompts: Sequence[PromptBlocks], session_ids: Sequence[str], top: int
) -> dict[BlockHash, int]:
    """Up to ``top`` maximal shared prefixes (key of their last block -> sessions that sent them), most
    shared first; ties in the order the trace first sent them (never the hash's set order, which
    differs between processes for byte keys)."""
    sessions: dict[BlockHash, set[str]] = {}
    for prompt, session in zip(prompts, session_ids):
        for key in prompt.block_hashes:
            sessions.setdefault(key, set()).add(session)
    counts = {key: len(s) for key, s in sessions.items() if len(s) >= 2}
    maximal = set(counts)
    for prompt in prompts:
        keys = prompt.block_hashes
        for key, child in zip(keys, keys[1:]):
            if key in maximal and counts.get(child) == counts[key]:
                maximal.discard(key)
    ranked = sorted((key for key in sessions if key in maximal), key=lambda k: -counts[k])[:top]
    return {key: counts[key] for key in ranked}


def prepare_route_trace(
    requests: Sequence[Request], cache: CacheConfig, top_prefixes: int = 5, keep_tokens: bool = False
) -> RouteTrace:
    """Sort by arrival (stable), hash every prompt's blocks with ``cache``'s block size and hash.
    ``keep_tokens``: keep every block's token ids (``kv_aware`` reads them from the caches' events);
    the radix cache and ``verify_tokens`` keep them anyway."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    keep = keep_tokens or cache.kind is CacheKind.RADIX or cache.verify_tokens
    prompts = prompt_blocks_of(ordered, cache.block_size, cache.hash, keep_tokens=keep)
    sessions = [r.session_id for r in ordered]
    outputs = np.array([r.output_tokens or r.max_tokens for r in ordered], dtype=np.int64)
    return RouteTrace(
        prompts,
        np.array([r.arrival_s for r in ordered], dtype=np.float64),
        sessions,
        outputs,
        cache.block_size,
        popular_prefixes(prompts, sessions, top_prefixes),
        [routing_text(r) for r in ordered],
        [r.token_ids for r in ordered],
    )


@dataclass(frozen=True)
class ClusterConfig:
    """``num_replicas`` replicas, each with a cache built from ``cache`` and timed by ``service``."""

    num_replicas: int
    cache: CacheConfig
    service: ServiceModel = field(default_factory=ServiceModel)

    def __post_init__(self) -> None:
        if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
            raise ValueError(f"num_replicas must be a positive integer, got {self.num_replicas!r}")


@dataclass(eq=False)
class ClusterRun:
    """Per request (arrival order): ``replica``, ``cached_tokens``, ``queue_ms``, ``ttft_ms``,
    ``e2e_ms``, ``loads`` at arrival (shape (num_requests, num_replicas)); per replica ``busy_ms``
    (prefill time);
    ``copies``: popular prefix key -> replicas that prefilled it."""

    trace: RouteTrace
    config: ClusterConfig
    replica: np.ndarray
    cached_tokens: np.ndarray
    queue_ms: np.ndarray
    ttft_ms: np.ndarray
    e2e_ms: np.ndarray
    loads: np.ndarray
    busy_ms: np.ndarray
    copies: dict[BlockHash, set[int]]


class _Replica:
    def __init__(self, cache: CacheConfig) -> None:
        self.now_s = 0.0
        self.cache = make_cache(cache, clock=lambda: self.now_s)
        self.free_at_s = 0.0
        self.ends_s: list[float] = []  # heap of the finish times of unfinished requests

    def load_at(self, now_s: float) -> int:
        while self.ends_s and self.ends_s[0] <= now_s:
            heapq.heappop(self.ends_s)
        return len(self.ends_s)

    def serve(self, prompt: PromptBlocks, start_s: float) -> int:
        """One step (lookup / insert / release) at ``start_s``; returns the hit in blocks."""
        self.now_s = start_s
        return step(self.cache, prompt).num_hit_blocks


def simulate_cluster(trace: RouteTrace, router: Router, config: ClusterConfig) -> ClusterRun:
    """Route and serve every request of ``trace``; see the module docstring.

    Raises:
        ValueError: the cache's block size differs from the trace's.
    """
    if config.cache.block_size != trace.block_size:
        raise ValueError(
            f"trace was hashed for block size {trace.block_size}, cache uses {config.cache.block_size}"
        )
    n, replicas = trace.num_requests, [_Replica(config.cache) for _ in range(config.num_replicas)]
    attach = getattr(router, "attach", None)
    if attach is not None:
        attach([replica.cache for replica in replicas])
    out = {name: np.zeros(n) for name in ("queue_ms", "ttft_ms", "e2e_ms")}
    chosen, cached = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    loads = np.zeros((n, config.num_replicas), dtype=np.int64)
    busy = np.zeros(config.num_replicas)
    copies: dict[BlockHash, set[int]] = {key: set() for key in trace.popular}
    service = config.service
    for i, (prompt, arrival_s) in enumerate(zip(trace.prompts, trace.arrivals_s.tolist())):
        loads[i] = [r.load_at(arrival_s) for r in replicas]
        view = RequestView(
            trace.session_ids[i],
            prompt,
            arrival_s,
            trace.texts[i] if trace.texts is not None else "",
            trace.token_ids[i] if trace.token_ids is not None else None,
        )
        index = router.choose(view, loads[i].tolist())
        replica = replicas[index]
        start_s = max(arrival_s, replica.free_at_s)
        hit_blocks = replica.serve(prompt, start_s)
        cached[i], chosen[i] = hit_blocks * trace.block_size, index
        prefill_ms = service.prefill_ms(prompt.num_tokens - int(cached[i]))
        work_ms = prefill_ms + service.decode_ms(int(trace.output_tokens[i]))
        out["queue_ms"][i] = (start_s - arrival_s) * 1e3
        out["ttft_ms"][i] = out["queue_ms"][i] + prefill_ms
        out["e2e_ms"][i] = out["queue_ms"][i] + work_ms
        replica.free_at_s = start_s + prefill_ms / 1e3
        heapq.heappush(replica.ends_s, start_s + work_ms / 1e3)
        busy[index] += prefill_ms
        for key in prompt.block_hashes[hit_blocks:]:
            if key in copies:
                copies[key].add(index)
    return ClusterRun(
        trace, config, chosen, cached, out["queue_ms"], out["ttft_ms"], out["e2e_ms"], loads, busy, copies
    )


def requests_per_replica(run: ClusterRun) -> np.ndarray:
    """Requests each replica served, shape (num_replicas,)."""
    counts = Counter(run.replica.tolist())
    return np.array([counts.get(r, 0) for r in range(run.config.num_replicas)], dtype=np.int64)
