"""Settings shared by ``kvbench run`` and ``kvbench sweep``: the cache config a run uses, its
``[run]`` settings after flags, the simulator's per-request prediction, and the cache metadata."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvbench.cache.block_hash import HashConfig
from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.errors import InputError
from kvbench.run.source import RunSection, RunSource, token_ids_of
from kvbench.run.loop import RunRequest
from kvbench.sim.replay import prepare_prompts, simulate


def parse_cache_size(text: str, bytes_per_block: int) -> int:
    """``"4096"`` (blocks) or ``"1GiB"`` (bytes, converted with the model's block size) -> blocks."""
    from kvbench.memory.layout import parse_bytes

    text = str(text).strip()
    if text.replace("_", "").isdigit():
        blocks = int(text.replace("_", ""))
    else:
        blocks = parse_bytes(text) // bytes_per_block
    if blocks < 1:
        raise InputError(f"--cache-size {text}: holds no block (one block is {bytes_per_block:,} bytes)")
    return blocks


def cache_config(source: RunSource, options: dict[str, Any], bytes_per_block: int, block_size: int) -> CacheConfig:
    """The cache a run uses: flags in ``options`` over the scenario's ``[cache]``. Raises ``InputError``."""
    section = source.cache
    try:
        return CacheConfig(
            capacity_blocks=parse_cache_size(options["cache_size"] or source.run.cache_size, bytes_per_block),
            block_size=block_size,
            kind=options["cache_kind"] or section.kind,
            ttl_s=options["ttl"] if options["ttl"] is not None else section.ttl_s,
            release_order=options["release"] or section.release_order,
            hash=HashConfig(options["hash_algo"] or section.hash_algo,
                            options["hash_bits"] if options["hash_bits"] is not None else section.hash_bits),
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None


def expected_cached_tokens(requests: list[RunRequest], cache: CacheConfig | None) -> list[int | None]:
    """The simulator's prediction per request for this cache (exact at concurrency 1, no TTL)."""
    if cache is None:
        return [0] * len(requests)
    if cache.ttl_s is not None:
        return [None] * len(requests)  # the engine's TTL runs on wall time, the simulator's on trace time
    trace = prepare_prompts(token_ids_of(requests), cache.block_size, cache.hash,
                            keep_tokens=cache.kind is CacheKind.RADIX)
    predicted = simulate(trace, cache).cached_tokens_per_request
    return [int(value) for value in predicted]


def run_section(source: RunSource, options: dict[str, Any]) -> RunSection:
    """The scenario's ``[run]`` settings with the flags given in ``options``. Raises ``InputError``."""
    overrides = {key: options[key] for key in ("num_requests", "concurrency", "warmup", "max_tokens", "cache",
                                               "verify", "temperature", "top_p", "seed")
                 if options.get(key) is not None}
    if options.get("ignore_eos") is not None:
        overrides["ignore_eos"] = options["ignore_eos"]
    try:
        return replace(source.run, **overrides)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def cache_metadata(cache: CacheConfig | None) -> dict[str, Any]:
    """The ``run.cache`` metadata of a results file."""
    if cache is None:
        return {"enabled": False}
    return {"enabled": True, "kind": cache.kind.value, "block_size": cache.block_size,
            "capacity_blocks": cache.capacity_blocks, "ttl_s": cache.ttl_s,
            "release_order": cache.release_order.value, "hash_algo": cache.hash.algo.value,
            "hash_bits": cache.hash.hash_bits}
