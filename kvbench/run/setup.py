"""Settings shared by ``kvbench run`` and ``kvbench sweep``: the cache config a run uses, its
``[run]`` settings after flags, and the cache metadata. (The per-request prediction is
:func:`kvbench.sim.predict.expected_cached_tokens`.)"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from kvbench.cache.base import CacheConfig
from kvbench.cache.block_hash import HashConfig
from kvbench.errors import InputError, checked
from kvbench.run.config import CacheFlags, RunFlags
from kvbench.run.scenario import CacheSection
from kvbench.run.source import RunSection, RunSource


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


def cache_config(
    section: CacheSection, flags: CacheFlags, capacity_blocks: int, block_size: int
) -> CacheConfig:
    """The cache a command uses: ``flags`` over a scenario's ``[cache]`` section (``CacheSection()``
    when there is none), of ``capacity_blocks`` blocks of ``block_size`` tokens. Raises ``InputError``."""
    return checked(
        lambda: CacheConfig(
            capacity_blocks=capacity_blocks,
            block_size=block_size,
            kind=flags.cache_kind or section.kind,
            ttl_s=flags.ttl if flags.ttl is not None else section.ttl_s,
            release_order=flags.release or section.release_order,
            hash=HashConfig(
                flags.hash_algo or section.hash_algo,
                flags.hash_bits if flags.hash_bits is not None else section.hash_bits,
            ),
            verify_tokens=section.verify_tokens,
            prompt_only=bool(flags.prompt_only),
        ),
        {
            "hash_bits": "--hash-bits" if flags.hash_bits is not None else "scenario key cache.hash_bits",
            "ttl_s": "--ttl" if flags.ttl is not None else "scenario key cache.ttl_s",
        },
    )


def run_section(source: RunSource, flags: RunFlags, cache: CacheFlags = CacheFlags()) -> RunSection:
    """The scenario's ``[run]`` settings with the flags given. Raises ``InputError``."""
    overrides = {f.name: getattr(flags, f.name) for f in fields(flags) if getattr(flags, f.name) is not None}
    for name in ("cache", "verify"):
        if getattr(cache, name) is not None:
            overrides[name] = getattr(cache, name)
    return checked(lambda: replace(source.run, **overrides))


def cache_metadata(cache: CacheConfig | None) -> dict[str, Any]:
    """The ``run.cache`` metadata of a results file."""
    if cache is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "kind": cache.kind.value,
        "block_size": cache.block_size,
        "capacity_blocks": cache.capacity_blocks,
        "ttl_s": cache.ttl_s,
        "release_order": cache.release_order.value,
        "hash_algo": cache.hash.algo.value,
        "hash_bits": cache.hash.hash_bits,
        "verify_tokens": cache.verify_tokens,
        "prompt_only": cache.prompt_only,
    }
