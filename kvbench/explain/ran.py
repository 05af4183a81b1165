"""What ran, as ``kvbench explain`` replays it: the rules of the cache a run really had.

A trace or scenario is replayed through kvbench's prefix cache with the flags given, its generated
tokens the trace's own replies (:mod:`kvbench.sim.outputs`). A run's results file is replayed by the
rules of what ran, read from its metadata, with the generated tokens of a run as placeholders (the
engine generated its own tokens, which no later prompt of the trace contains), as the run's own
prediction (:func:`kvbench.run.engines.predicted_cached_tokens`) does:

==============================  =====================================================================
run                             replay
==============================  =====================================================================
``--engine copy``               kvbench's prefix cache of ``run.cache`` (exact: the run's prediction)
``--engine paged``              the vLLM-faithful pool of ``run.engine.num_pool_blocks`` (its
                                admission, preemption and generated blocks); exact at concurrency 1
                                with ``--ignore-eos``, no TTL, no host tier
a server (``server_cache``)     the pool the run detected (kvbench serve: its hash cache; vLLM: the
                                vLLM-faithful pool), or ``--cache-size`` given to explain; prefix
                                caching off: nothing hits
==============================  =====================================================================

Where no replay is the run's (a paged run under concurrency, a host tier, a server whose pool is
unknown), the explanation says so once, with the flag that supplies what is missing; with
``use_reported`` the run's reported hits stand in for the replay's, so nothing is blamed on the
engine that a replay merely cannot know.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from kvbench.cache.base import CacheConfig
from kvbench.request import Request
from kvbench.results.what_ran import WhatRan, server_ran


class ReplayKind(str, Enum):
    """Which replay gives a request's hit."""

    CACHE = "cache"  # kvbench's prefix cache (kvbench.sim.replay.simulate)
    POOL = "pool"  # the vLLM-faithful KV pool (kvbench.sim.vllm_pool), as the paged engine and vLLM
    OFF = "off"  # prefix caching off: nothing hits


@dataclass(frozen=True)
class RunRules:
    """The rules a replay follows (module docstring).

    Attributes:
        what: words for what ran (``trace``, ``copy engine``, ``paged engine``, ``server``).
        replay: the replay that gives hits.
        is_run: a run's results (generated tokens are placeholders), not a trace.
        use_reported: the run's reported hits stand in for the replay's (no replay is the run's).
        host_tier_blocks: the host KV tier the run had (0: none).
        capacity_origin: where the cache size came from (``trace``: explain's flags on a trace;
            ``run``, ``detected``, ``given``, ``flag``, ``assumed``: :class:`WhatRan`'s ``origin``).
        notes: what explain cannot know, each once, with the flag that supplies it.
    """

    what: str = "trace"
    replay: ReplayKind = ReplayKind.CACHE
    is_run: bool = False
    use_reported: bool = False
    host_tier_blocks: int = 0
    capacity_origin: str = "trace"
    notes: tuple[str, ...] = ()

    def describe(self, config: CacheConfig) -> str:
        """``paged engine: KV pool of 14 blocks of 16`` and the like, for the explain title: the words
        ``compare`` and ``report`` name a run by (:class:`kvbench.results.what_ran.WhatRan`), for the
        cache replayed (``config``, explain's flags applied)."""
        structure = "KV pool" if self.replay is ReplayKind.POOL else f"{config.kind.value} cache"
        return WhatRan(
            self.what,
            self.replay is not ReplayKind.OFF,
            structure,
            config.capacity_blocks,
            config.block_size,
            self.capacity_origin,
            self.host_tier_blocks,
        ).describe()


TRACE_RULES = RunRules()


def pool_hits(requests: Sequence[Request], config: CacheConfig) -> np.ndarray:
    """Per request (in the order given, one at a time), the paged engine's cached tokens under
    ``config`` (its ``--cache-size`` pool), by the run's own predictor
    (:func:`kvbench.run.engines.predicted_cached_tokens` at concurrency 1 with ``--ignore-eos``); a
    request that does not fit the pool (an error row in a run) hits 0."""
    from kvbench.engine.kinds import EngineKind
    from kvbench.run.config import EngineFlags
    from kvbench.run.engines import predicted_cached_tokens

    predicted = predicted_cached_tokens(list(requests), EngineFlags(EngineKind.PAGED), config, 1, True)
    return np.array([value or 0 for value in predicted], dtype=np.int64)


def server_block_size(origins: dict) -> int | None:
    """The block size a server run's expectations used (``server_cache["block size"]``), or ``None``."""
    return server_ran(origins).block_size


def server_rules(origins: dict, capacity_flag: int | None) -> tuple[RunRules, int | None]:
    """The rules of a run against a server, from its ``server_cache`` metadata (what the run detected,
    :mod:`kvbench.backends.openai.server_cache`), and its pool in blocks (``None``: unknown, room for
    everything); ``capacity_flag``: explain's ``--cache-size``, which wins."""
    ran = server_ran(origins)
    if not ran.caching:
        return RunRules("server", ReplayKind.OFF, True, capacity_origin=ran.origin), None
    if capacity_flag is not None:
        return RunRules("server", ReplayKind.CACHE, True, capacity_origin="flag"), capacity_flag
    if ran.capacity_blocks is not None:
        replay = ReplayKind.POOL if ran.structure == "KV pool" else ReplayKind.CACHE
        return RunRules("server", replay, True, capacity_origin=ran.origin), ran.capacity_blocks
    note = (
        "the server published no pool size: replayed with room for everything, so what its pool "
        "evicted shows as lost to the server; give --cache-size N (its pool in blocks) to explain it"
    )
    return RunRules("server", ReplayKind.CACHE, True, capacity_origin="assumed", notes=(note,)), None


def engine_rules(run: dict, cache: CacheConfig | None) -> RunRules:
    """The rules of an in-process run, from its ``run.engine`` (the engine's ``describe()``), its
    concurrency, ``ignore_eos`` and cache (``None``: caching off)."""
    engine = run.get("engine") or {"kind": "copy"}
    kind = engine.get("kind", "copy")
    if cache is None:
        return RunRules(f"{kind} engine", ReplayKind.OFF, True, capacity_origin="run")
    if kind != "paged":
        return RunRules(f"{kind} engine", ReplayKind.CACHE, True, capacity_origin="run")
    host = int(engine.get("host_tier_blocks") or 0)
    reasons, flags = _pool_not_exact(run, cache, host)
    notes = ()
    if reasons:
        notes = (
            f"no replay is this paged run's ({', '.join(reasons)}): its reported hits stand in for the "
            "replay's, so every miss beyond the structural losses counts as capacity, and each fix is "
            f"replayed on the pool alone at concurrency 1 ({' '.join(flags)} gives an exact explanation)",
        )
    return RunRules("paged engine", ReplayKind.POOL, True, bool(reasons), host, "run", notes)


def _pool_not_exact(run: dict, cache: CacheConfig, host_tier_blocks: int) -> tuple[list[str], list[str]]:
    """Why the pool replay is not the paged run's, in words, and the run flags that make it so (both
    empty when it is): the conditions of :func:`kvbench.run.engines.predicted_cached_tokens`."""
    checks = (
        (host_tier_blocks, f"a host tier of {host_tier_blocks:,} blocks", "a run without --host-tier"),
        ((run.get("concurrency") or 1) != 1, f"concurrency {run.get('concurrency')}", "--concurrency 1"),
        (not run.get("ignore_eos", True), "requests may end at EOS", "--ignore-eos"),
        (cache.ttl_s is not None, f"a TTL of {cache.ttl_s or 0:g} s", "no --ttl"),
        (cache.release_order.value != "tail-first", "head-first release", "--release tail-first"),
    )
    return [why for found, why, _ in checks if found], [flag for found, _, flag in checks if found]
