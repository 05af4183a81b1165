"""What a run measured, in words, from its results file's metadata: the one name ``compare``,
``report`` (tables and plot legends), the scoreboard and ``explain``'s title give a run, and the one
line that says when runs ran under different load.

A run's cache is read from the metadata ``kvbench run`` writes:

* in process: ``run.engine.kind`` (copy, paged), ``run.cache`` (on or off, kind, blocks, block size;
  the paged engine's pool is ``run.engine.num_pool_blocks``, its host tier ``host_tier_blocks``);
* against a server: ``server_cache`` (:mod:`kvbench.backends.openai.server_cache`: what the run
  detected from the server's ``/metrics``, was given by a flag, or assumed).

For example ``copy engine: hash cache of 64 blocks of 16``, ``paged engine: KV pool of 30 blocks of
16, host tier of 16 blocks``, ``server: hash cache of 20 blocks of 16 (detected)``, ``server: prefix
caching off (detected)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SHOWN_ORIGINS = ("detected", "given", "flag", "assumed")  # "run": the run's own flags, said by nothing
POOL_BLOCKS = re.compile(r"^([\d,]+) blocks")
LEADING_NUMBER = re.compile(r"^(\d+)\b")


@dataclass(frozen=True)
class WhatRan:
    """A run's engine and cache.

    Attributes:
        engine: ``copy engine``, ``paged engine``, ``server`` (or ``trace`` for explain's own replay).
        caching: prefix caching on; ``None``: a server whose state the run did not record.
        structure: ``hash cache``, ``radix cache``, ``KV pool`` (the vLLM-faithful pool) or ``cache``.
        capacity_blocks: the cache or pool size in blocks; ``None``: unbounded (in process) or unknown.
        block_size: tokens per block.
        origin: where the size came from: ``run`` (its own flags), ``detected`` (the server's
            ``/metrics``), ``given`` (``--expected-cache-size``), ``flag`` (explain's ``--cache-size``),
            ``assumed``.
        host_tier_blocks: the paged engine's host KV tier (0: none).
        settings: the cache's other settings in words (head-first release, TTL, hash bits).
    """

    engine: str
    caching: bool | None
    structure: str = "hash cache"
    capacity_blocks: int | None = None
    block_size: int | None = None
    origin: str = "run"
    host_tier_blocks: int = 0
    settings: tuple[str, ...] = ()

    def describe(self, detail: bool = False) -> str:
        """``paged engine: KV pool of 30 blocks of 16, host tier of 16 blocks`` and the like; with
        ``detail``, the cache's other settings after it (``, TTL 300 s``)."""
        origin = f" ({self.origin})" if self.origin in SHOWN_ORIGINS else ""
        if self.caching is None:
            text = f"its own cache ({self.block_size or '?'}-token blocks expected)"
        elif not self.caching:
            text = f"prefix caching off{origin}"
        elif self.capacity_blocks is None:
            size = f"{self.structure} of unknown size" if origin else f"unbounded {self.structure}"
            text = f"{size}, blocks of {self.block_size or '?'}{origin}"
        else:
            text = f"{self.structure} of {self.capacity_blocks:,} blocks of {self.block_size or '?'}{origin}"
        if self.caching and self.host_tier_blocks:
            text += f", host tier of {self.host_tier_blocks:,} blocks"
        if detail and self.caching and self.settings:
            text += ", " + ", ".join(self.settings)
        return text if self.engine == "trace" else f"{self.engine}: {text}"


def what_ran(metadata: Mapping[str, Any]) -> WhatRan:
    """What a ``kvbench run`` results file measured (module docstring), from its metadata."""
    run = metadata.get("run") or {}
    cache = run.get("cache") or {}
    if run.get("backend", "inprocess") != "inprocess":
        origins = metadata.get("server_cache")
        if origins is None:  # a run that recorded no server cache (e.g. the Anthropic API)
            return WhatRan("server", None, block_size=cache.get("block_size"))
        return server_ran(origins)
    engine = run.get("engine") or {"kind": "copy"}
    kind = engine.get("kind", "copy")
    block_size = cache.get("block_size")
    if not cache.get("enabled", True):
        return WhatRan(f"{kind} engine", False, block_size=block_size)
    if kind == "paged":
        capacity = engine.get("num_pool_blocks") or cache.get("capacity_blocks")
        host = int(engine.get("host_tier_blocks") or 0)
        return WhatRan("paged engine", True, "KV pool", capacity, block_size, "run", host, _settings(cache))
    structure = f"{cache.get('kind', 'hash')} cache"
    return WhatRan(
        f"{kind} engine",
        True,
        structure,
        cache.get("capacity_blocks"),
        block_size,
        "run",
        0,
        _settings(cache),
    )


def server_ran(origins: Mapping[str, str]) -> WhatRan:
    """A server's cache as a run saw it, from its ``server_cache`` metadata: one line per setting
    (:attr:`kvbench.backends.openai.server_cache.ServerCache.origins`)."""
    block = LEADING_NUMBER.match(origins.get("block size", ""))
    block_size = None if block is None else int(block.group(1))
    if origins.get("prefix caching", "").startswith("off"):
        return WhatRan("server", False, block_size=block_size, origin="detected")
    pool = origins.get("pool", "")
    match = POOL_BLOCKS.match(pool)
    if match is None:
        return WhatRan("server", True, "cache", None, block_size, "assumed")
    structure = "KV pool" if "vLLM-faithful" in pool else "hash cache"
    origin = "given" if "flag" in pool else "detected"
    return WhatRan("server", True, structure, int(match.group(1).replace(",", "")), block_size, origin)


def _settings(cache: Mapping[str, Any]) -> tuple[str, ...]:
    """The in-process cache's settings beyond its size, in words."""
    settings = []
    if cache.get("release_order") == "head-first":
        settings.append("head-first release")
    if cache.get("ttl_s"):
        settings.append(f"TTL {cache['ttl_s']:g} s")
    if cache.get("hash_bits"):
        settings.append(f"{cache['hash_bits']}-bit keys")
    if cache.get("prompt_only"):
        settings.append("prompt blocks only")
    return tuple(settings)


def run_load(metadata: Mapping[str, Any], num_requests: int | None) -> dict[str, str]:
    """The load a run ran under, in words, by setting: concurrency, request rate, burstiness, time
    scale (``run.load`` of a server run, ``run.concurrency`` in process), ``max_tokens``, the
    ``num_requests`` measured and the warm-up requests (``run.warmup``)."""
    run = metadata.get("run") or {}
    load = run.get("load") or {}
    concurrency = load.get("concurrency", run.get("concurrency")) if load else run.get("concurrency")
    rate = load.get("request_rate_per_s")
    return {
        "concurrency": "no cap" if concurrency is None and load else str(concurrency or 1),
        "request rate": "closed loop" if rate is None else f"{rate:g}/s",
        "burstiness": f"{load.get('burstiness') or 1.0:g}",
        "time scale": "-" if load.get("time_scale") is None else f"{load['time_scale']:g}x",
        "max_tokens": "the trace's" if run.get("max_tokens") is None else f"{run['max_tokens']:,}",
        "measured requests": "?" if num_requests is None else f"{num_requests:,}",
        "warm-up requests": f"{run.get('warmup') or 0:,}",
    }


def load_warning(runs: Sequence[tuple[str, Mapping[str, Any], int | None]]) -> str | None:
    """One line naming every load setting (:func:`run_load`) that differs between ``runs`` (name,
    metadata, measured requests), each value with the runs that had it, e.g. ``ran under different
    load: concurrency 1 (off) vs 4 (on); max_tokens 4 (off) vs the trace's (on): their latencies are
    not comparable``; ``None`` when they all ran under the same load."""
    loads = [(name, run_load(metadata, num_requests)) for name, metadata, num_requests in runs]
    parts = []
    for setting in loads[0][1] if loads else ():
        values: dict[str, list[str]] = {}
        for name, load in loads:
            values.setdefault(load[setting], []).append(name)
        if len(values) > 1:
            parts.append(f"{setting} " + " vs ".join(f"{v} ({', '.join(n)})" for v, n in values.items()))
    if not parts:
        return None
    return f"ran under different load: {'; '.join(parts)}: their latencies are not comparable"
