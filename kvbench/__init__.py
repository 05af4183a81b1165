"""kvbench: measure what prefix caching buys an LLM server, and why it is not buying more.

The library API (README, "Python API"); names load on first use, so ``import kvbench`` stays light
(no torch until an engine is built)::

    import kvbench
    cache = kvbench.make_cache(kvbench.CacheConfig(capacity_blocks=1024, block_size=16))
    source = kvbench.load_source("scenarios/shared_2k.toml")        # requests as kvbench.Request
    print(kvbench.replay(source.requests, kvbench.CacheConfig(capacity_blocks=512)).token_hit_rate)
    outcome = kvbench.run_scenario(kvbench.RunConfig("scenarios/shared_2k.toml",
    run=kvbench.RunFlags(num_requests=5)))
    print(kvbench.load_result(outcome.path).summary)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {  # name -> the module that defines it
    "Request": "kvbench.request",
    "RequestRecord": "kvbench.request",
    "Message": "kvbench.request",
    "Phase": "kvbench.request",
    "Status": "kvbench.request",
    "CacheConfig": "kvbench.cache.base",
    "CacheKind": "kvbench.cache.base",
    "ReleaseOrder": "kvbench.cache.base",
    "make_cache": "kvbench.cache.base",
    "BlockHasher": "kvbench.cache.block_hash",
    "HashConfig": "kvbench.cache.block_hash",
    "load_source": "kvbench.run.source",
    "load_tokenizer": "kvbench.workloads.tokenizer",
    "replay": "kvbench.sim.replay",
    "sweep_caches": "kvbench.sim.replay",
    "expected_cached_tokens": "kvbench.sim.predict",
    "Unbounded": "kvbench.sim.predict",
    "RunConfig": "kvbench.run.config",
    "RunFlags": "kvbench.run.config",
    "CacheFlags": "kvbench.run.config",
    "ModelFlags": "kvbench.run.config",
    "ServerFlags": "kvbench.run.config",
    "SweepConfig": "kvbench.run.config",
    "BackendKind": "kvbench.run.config",
    "run_scenario": "kvbench.run.api",
    "sweep": "kvbench.run.api",
    "RunOutcome": "kvbench.run.execute",
    "LoadConfig": "kvbench.run.loop",
    "send_requests": "kvbench.run.loop",
    "run_requests": "kvbench.run.loop",
    "VirtualClock": "kvbench.run.clock",
    "load_result": "kvbench.results.files",
    "load_results": "kvbench.results.files",
}
# kvbench.run is the run/ package, so its entry point is run_scenario (scenario or trace file);
# kvbench.sweep is the engine sweep, the cache-only one is sweep_caches.
_RENAMED = {"sweep_caches": "sweep", "run_scenario": "run"}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'kvbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
