"""Which cache the expectations assume: the flags, what the server's ``/metrics`` publishes, or defaults.

Each setting comes from the first of (a) a flag (``--server-block-size``, ``--expected-cache-size``),
(b) the server's ``/metrics`` (:func:`kvbench.backends.openai.metrics.detect_cache_settings`), (c) an
assumption, and the run says which (:attr:`ServerCache.origins`):

* **block size**: the flag; ``block_size`` of ``vllm:cache_config_info`` (or kvbench serve's);
  1 for SGLang (its default ``page_size``); else 16 (vLLM's default).
* **pool**: the flag (a kvbench hash cache of that many blocks); vLLM's ``num_gpu_blocks``, replayed
  through the vLLM-faithful pool (:mod:`kvbench.sim.vllm_pool`: output blocks included, lazy
  eviction); kvbench serve's cache size (its own hash cache); else unbounded (the ideal).
* **prefix caching**: ``enable_prefix_caching``; off means every request is expected to hit 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvbench.backends.openai.metrics import SGLANG_PAGE_SIZE, ServerCacheSettings
from kvbench.backends.openai.reconcile import Expectations
from kvbench.cache.base import CacheConfig
from kvbench.request import Request
from kvbench.sim.predict import Unbounded, expected_cached_tokens
from kvbench.sim.replay import prompt_blocks_of
from kvbench.sim.vllm_pool import VllmPoolConfig

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size


@dataclass(frozen=True)
class ServerCache:
    """The cache model the expectations use, and where each setting came from.

    Attributes:
        block_size: tokens per block. model: what :func:`kvbench.sim.predict.expected_cached_tokens`
            replays (``None``: prefix caching off). capacity_blocks: the pool or cache size, ``None``
            = unbounded. origins: setting -> ``"flag ..."``, ``"detected ..."`` or ``"assumed ..."``.
    """

    block_size: int
    model: CacheConfig | Unbounded | VllmPoolConfig | None
    capacity_blocks: int | None
    origins: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """One line per setting, for the run's notes."""
        return [f"server cache {name}: {origin}" for name, origin in self.origins.items()]


def _block_size(detected: ServerCacheSettings, flag: int | None) -> tuple[int, str]:
    if flag is not None:
        return flag, f"{flag} (flag --server-block-size)"
    if detected.block_size is not None:
        return detected.block_size, f"{detected.block_size} (detected: {detected.server}:cache_config_info)"
    if detected.server == "sglang":
        return (
            SGLANG_PAGE_SIZE,
            f"{SGLANG_PAGE_SIZE} (assumed: SGLang's default page size; not in its metrics)",
        )
    return DEFAULT_BLOCK_SIZE, f"{DEFAULT_BLOCK_SIZE} (assumed: vLLM's default; the server publishes none)"


def resolve_server_cache(
    detected: ServerCacheSettings, block_flag: int | None, capacity_flag: int | None
) -> ServerCache:
    """The cache model for expectations (module docstring)."""
    block_size, block_origin = _block_size(detected, block_flag)
    origins = {"block size": block_origin}
    if detected.prefix_caching is False:
        origins["prefix caching"] = (
            f"off (detected: {detected.server}:cache_config_info); every request expects 0"
        )
        return ServerCache(block_size, None, None, origins)
    origins["prefix caching"] = "on (detected)" if detected.prefix_caching else "assumed on"
    if capacity_flag is not None:
        origins["pool"] = f"{capacity_flag:,} blocks (flag --expected-cache-size)"
        return ServerCache(block_size, CacheConfig(capacity_flag, block_size), capacity_flag, origins)
    blocks = detected.num_gpu_blocks
    if blocks is not None and detected.server == "vllm" and blocks > 1:
        origins["pool"] = f"{blocks:,} blocks (detected: num_gpu_blocks; vLLM-faithful pool replay)"
        return ServerCache(block_size, VllmPoolConfig(blocks, block_size), blocks, origins)
    if blocks is not None and detected.server == "kvbench" and blocks > 0:
        origins["pool"] = f"{blocks:,} blocks (detected: kvbench serve's cache size)"
        return ServerCache(block_size, CacheConfig(blocks, block_size), blocks, origins)
    origins["pool"] = "unbounded (assumed: the server publishes no pool size)"
    return ServerCache(block_size, Unbounded(block_size), None, origins)


def server_expectations(requests: Sequence[Request], cache: ServerCache, ignore_eos: bool) -> Expectations:
    """Per-request expected cached tokens under ``cache`` (in request order), plus each request's
    blocks for reconciliation. The vLLM pool needs each output's length: ``max_tokens`` with
    ``ignore_eos``, else the trace's ``output_tokens`` (without one it falls back to an unbounded
    cache and says so in ``cache.origins``)."""
    model = cache.model
    if isinstance(model, VllmPoolConfig):
        if ignore_eos:
            requests = [replace(r, output_tokens=r.max_tokens) for r in requests]
        if any(r.output_tokens is None for r in requests):
            cache.origins["pool"] += "; output lengths unknown, so the replay is unbounded"
            model = Unbounded(cache.block_size)
    try:
        expected = [0] * len(requests) if model is None else expected_cached_tokens(requests, model)
    except ValueError as exc:  # a request that cannot fit in the detected pool
        cache.origins["pool"] += f"; not replayable ({exc}), so the replay is unbounded"
        expected = expected_cached_tokens(requests, Unbounded(cache.block_size))
    return Expectations(
        prompt_blocks_of(requests, cache.block_size), expected, cache.block_size, cache.capacity_blocks
    )
