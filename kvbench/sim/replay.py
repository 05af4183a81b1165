"""Replay token-id traffic through a prefix cache with no model: hit rate vs cache size and policy.

Per request, in arrival order, one :func:`kvbench.sim.step.step` (what an engine does around its
forward pass, at concurrency 1):

1. ``lookup`` with the last-token cap ``(len - 1) // block_size`` (vLLM, SGLang);
2. ``insert`` every full block after the hit (the engine computed them): the prompt's, or, when the
   replay is given each request's output ids (:mod:`kvbench.sim.outputs`), those of prompt + output
   - 1 tokens, as the engine stores them by default;
3. ``release`` everything the request pinned.

The cache's clock reads each request's arrival time, so a TTL acts on trace time.

A sweep hashes each request's blocks once (:func:`prepare_prompts`) and replays the same prompts
through one fresh cache per (capacity, release order).

Rates: token hit rate = cached prompt tokens / prompt tokens (the denominator vLLM's
``prefix_cache_queries`` counter uses); block hit rate = hit blocks / blocks the cap allowed.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace

import numpy as np

from kvbench.cache.base import CacheConfig, CacheKind, ReleaseOrder, make_cache
from kvbench.cache.block_hash import HashConfig, PromptBlocks
from kvbench.request import Request
from kvbench.sim.bounds import unbounded_capacity_blocks
from kvbench.sim.outputs import Outputs, stored_blocks_of
from kvbench.sim.shared_prefixes import hash_prompts
from kvbench.sim.step import StepResult, step

Progress = Callable[["SimResult", int, int], None]  # (result just finished, configs done, total)
Observer = Callable[[int, StepResult], None]  # (request position, its step)


@dataclass(frozen=True, eq=False)
class PreparedTrace:
    """A trace cut into blocks once, ready to replay through any number of caches.

    Attributes:
        prompts: one :class:`PromptBlocks` per request, in arrival order.
        arrivals_s: arrival offsets, seconds; shape (num_requests,).
        block_size: tokens per block the keys were computed for.
        stored: per request, the blocks it stores (prompt + output - 1 tokens; their first keys are
            the prompt's), or ``None`` when each request stores its prompt's blocks only.
    """

    prompts: list[PromptBlocks]
    arrivals_s: np.ndarray
    block_size: int
    stored: list[PromptBlocks] | None = None

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(prompt.num_tokens for prompt in self.prompts)

    @property
    def num_full_blocks(self) -> int:
        """Full blocks over all requests: an upper bound on the distinct blocks a cache can hold."""
        return sum(prompt.num_full_blocks for prompt in self.prompts)


def prompt_blocks_of(
    requests: Sequence[Request],
    block_size: int,
    hash_config: HashConfig = HashConfig(),
    keep_tokens: bool = False,
) -> list[PromptBlocks]:
    """Every request's full blocks and keys, in request order (salt ``None`` = the public ``""``);
    a prefix shared with an earlier prompt is not hashed again (:mod:`kvbench.sim.shared_prefixes`)."""
    return hash_prompts(requests, block_size, hash_config, keep_tokens)


def prepare_prompts(
    requests: Sequence[Request],
    block_size: int,
    hash_config: HashConfig = HashConfig(),
    keep_tokens: bool = False,
    outputs: Outputs | None = None,
) -> PreparedTrace:
    """Hash every request's full blocks once, in arrival order (stable). ``keep_tokens`` is needed by
    the radix cache; ``outputs`` (per request, the generated ids or ``None``) makes each request
    store its prompt + output - 1 tokens (:func:`kvbench.sim.outputs.stored_blocks_of`)."""
    prompts = prompt_blocks_of(requests, block_size, hash_config, keep_tokens)
    stored = (
        None if outputs is None else stored_blocks_of(requests, outputs, block_size, hash_config, keep_tokens)
    )
    arrivals = np.array([r.arrival_s for r in requests], dtype=np.float64)
    return in_arrival_order(prompts, arrivals, block_size, stored)


def in_arrival_order(
    prompts: list[PromptBlocks],
    arrivals_s: np.ndarray,
    block_size: int,
    stored: list[PromptBlocks] | None = None,
) -> PreparedTrace:
    """The trace of ``prompts`` (trace order) arriving at ``arrivals_s`` (seconds), stably sorted by
    arrival (the order every replay and pass takes)."""
    if arrivals_s.size > 1 and np.any(np.diff(arrivals_s) < 0):
        order = np.argsort(arrivals_s, kind="stable")
        prompts = [prompts[i] for i in order]
        stored = None if stored is None else [stored[i] for i in order]
        arrivals_s = arrivals_s[order]
    return PreparedTrace(prompts, arrivals_s, block_size, stored)


@dataclass
class SimResult:
    """Outcome of one replay through one cache. Token counts are in tokens, block counts in blocks."""

    capacity_blocks: int
    release_order: str
    cache_kind: str
    block_size: int
    ttl_s: float | None
    num_requests: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_queried_blocks: int
    num_hit_blocks: int
    num_inserted_blocks: int
    num_evicted_blocks: int
    num_expired_blocks: int
    num_refused_blocks: int
    cached_tokens_per_request: np.ndarray = field(repr=False)
    method: str = "replay"  # or "one-pass" (kvbench.sim.curve): how these numbers were computed

    @property
    def token_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens."""
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        """Hit blocks / blocks the last-token cap allowed to hit."""
        return self.num_hit_blocks / self.num_queried_blocks if self.num_queried_blocks else 0.0

    def as_row(self) -> dict:
        """One Parquet/table row (units in the names)."""
        return {
            "capacity_blocks": self.capacity_blocks,
            "release_order": self.release_order,
            "cache_kind": self.cache_kind,
            "block_size": self.block_size,
            "ttl_s": self.ttl_s,
            "num_requests": self.num_requests,
            "prompt_tokens": self.num_prompt_tokens,
            "cached_prompt_tokens": self.num_cached_tokens,
            "token_hit_rate": self.token_hit_rate,
            "block_hit_rate": self.block_hit_rate,
            "hit_blocks": self.num_hit_blocks,
            "queried_blocks": self.num_queried_blocks,
            "inserted_blocks": self.num_inserted_blocks,
            "evictions": self.num_evicted_blocks,
            "expirations": self.num_expired_blocks,
            "refused_inserts": self.num_refused_blocks,
            "method": self.method,
        }


def simulate(trace: PreparedTrace, config: CacheConfig, on_request: Observer | None = None) -> SimResult:
    """Replay ``trace`` through a fresh cache built from ``config``, one :func:`~kvbench.sim.step.step`
    per request. ``on_request(index, step)`` (if given) sees every request's step once it released
    its blocks (``kvbench explain`` reads the hits and insert counts there).

    Raises:
        ValueError: ``config.block_size`` differs from the trace's.
    """
    if config.block_size != trace.block_size:
        raise ValueError(
            f"trace was hashed for block size {trace.block_size}, cache uses {config.block_size}"
        )
    now = [0.0]
    cache = make_cache(config, clock=lambda: now[0])
    hit_blocks = np.zeros(trace.num_requests, dtype=np.int64)
    stored = trace.stored or trace.prompts
    for index, (prompt, arrival_s) in enumerate(zip(trace.prompts, trace.arrivals_s.tolist())):
        now[0] = arrival_s
        done = step(cache, prompt, stored[index])
        if on_request is not None:
            on_request(index, done)
        hit_blocks[index] = done.match.num_hit_blocks
    stats = cache.stats
    cached = hit_blocks * trace.block_size
    return SimResult(
        capacity_blocks=config.capacity_blocks,
        release_order=config.release_order.value,
        cache_kind=config.kind.value,
        block_size=config.block_size,
        ttl_s=config.ttl_s,
        num_requests=trace.num_requests,
        num_prompt_tokens=trace.num_prompt_tokens,
        num_cached_tokens=int(cached.sum()),
        num_queried_blocks=stats.num_queried_blocks,
        num_hit_blocks=stats.num_hit_blocks,
        num_inserted_blocks=stats.num_inserted_blocks,
        num_evicted_blocks=stats.num_evicted_blocks,
        num_expired_blocks=stats.num_expired_blocks,
        num_refused_blocks=stats.num_refused_blocks,
        cached_tokens_per_request=cached,
    )


def replay(requests: Sequence[Request], config: CacheConfig, outputs: Outputs | None = None) -> SimResult:
    """Replay ``requests`` (in arrival order) through a fresh cache built from ``config``: the
    cache-only replay of ``kvbench sim`` for one cache. Hashes once; for many caches use
    :func:`prepare_prompts` and :func:`sweep`. With ``outputs`` (per request, generated ids or
    ``None``; ignored when ``config.prompt_only``) each request stores prompt + output - 1 tokens;
    without, its prompt's blocks only."""
    keep_tokens = config.kind is CacheKind.RADIX or config.verify_tokens
    outputs = None if config.prompt_only else outputs
    return simulate(prepare_prompts(requests, config.block_size, config.hash, keep_tokens, outputs), config)


def sweep(
    trace: PreparedTrace,
    base: CacheConfig,
    capacities_blocks: Iterable[int],
    release_orders: Iterable[ReleaseOrder | str] = (ReleaseOrder.TAIL_FIRST,),
    progress: Progress | None = None,
    num_workers: int = 1,
) -> list[SimResult]:
    """One :func:`simulate` per (capacity, release order), sizes outermost, in the order given.

    With ``num_workers > 1`` the replays run in forked worker processes (each replay is independent
    and the trace is shared copy-on-write); results come back in the same order.
    """
    configs = [
        replace(base, capacity_blocks=capacity, release_order=ReleaseOrder(order))
        for capacity in capacities_blocks
        for order in release_orders
    ]
    if num_workers > 1 and len(configs) > 1 and "fork" in mp.get_all_start_methods():
        return _sweep_parallel(trace, configs, progress, num_workers)
    results = []
    for done, config in enumerate(configs, start=1):
        results.append(simulate(trace, config))
        if progress is not None:
            progress(results[-1], done, len(configs))
    return results


_worker_trace: list[PreparedTrace] = []  # set once in each forked worker by _init_worker


def _init_worker(trace: PreparedTrace) -> None:
    _worker_trace.append(trace)


def _simulate_in_worker(config: CacheConfig) -> SimResult:
    return simulate(_worker_trace[0], config)


def _sweep_parallel(
    trace: PreparedTrace, configs: list[CacheConfig], progress: Progress | None, num_workers: int
) -> list[SimResult]:
    context = mp.get_context("fork")  # fork: the workers inherit the hashed trace without pickling
    workers = min(num_workers, len(configs))
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(trace,)
    ) as pool:
        futures = [pool.submit(_simulate_in_worker, config) for config in configs]
        for done, future in enumerate(as_completed(futures), start=1):
            if progress is not None:
                progress(future.result(), done, len(configs))
        return [future.result() for future in futures]


def ideal_hit_rate(trace: PreparedTrace, kind: CacheKind = CacheKind.HASH) -> SimResult:
    """Replay through a cache that never evicts (capacity = every full block of the trace)."""
    capacity = unbounded_capacity_blocks((prompt.num_tokens for prompt in trace.prompts), trace.block_size)
    return simulate(trace, CacheConfig(capacity_blocks=capacity, block_size=trace.block_size, kind=kind))
