"""Building the in-process engine a run asked for (``--engine copy|paged``) behind its backend
(:func:`build_backend`, the one assembly path) and its cached-tokens prediction, by the replay the
kind's spec names (:class:`kvbench.engine.kinds.CacheModel`):

* ``prefix-cache`` (``copy``: :class:`kvbench.engine.engine.HFEngine`): kvbench's cache replay
  (:func:`kvbench.sim.predict.expected_cached_tokens` with the :class:`CacheConfig`).
* ``kv-pool`` (``paged``: :class:`kvbench.engine.paged.engine.PagedEngine`, its pool sized by
  ``--cache-size``, running and cached blocks together, as vLLM's): the vLLM-faithful pool
  (:class:`kvbench.sim.vllm_pool.VllmPoolConfig`, the null block added; its radix mode for
  ``--cache-kind radix``), which is exact at
  concurrency 1 when every request decodes exactly ``max_tokens`` (``--ignore-eos``). Under
  concurrency, or when EOS may end a request early, the prediction is ``None``: the blocks held by
  requests running side by side depend on timing. With ``--ttl`` it is ``None`` too: that pool
  has no TTL (vLLM has none), and expiry depends on the engine's wall-clock release times; and with
  ``--release head-first``, which that pool does not model (vLLM releases tail first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from kvbench.cache.base import CacheConfig
from kvbench.engine.kinds import CacheModel
from kvbench.engine.paged.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from kvbench.errors import checked
from kvbench.request import Request
from kvbench.run.checks import host_tier_blocks
from kvbench.run.config import EngineFlags
from kvbench.sim.predict import expected_cached_tokens
from kvbench.sim.vllm_pool import NUM_NULL_BLOCKS, VllmPoolConfig

if TYPE_CHECKING:
    from kvbench.engine.sampling import SamplingParams


def build_backend(
    loaded,
    flags: EngineFlags,
    cache: CacheConfig | None,
    pool: CacheConfig | None = None,
    sampling: SamplingParams | None = None,
    verify: bool = False,
    salt: str = "",
    name: str | None = None,
    store_views: bool = False,
):
    """The engine ``flags.engine`` names over ``loaded`` (:func:`kvbench.engine.factory.make_engine`)
    behind the in-process backend: the one assembly path of ``run``, ``sweep``, ``break`` and ``serve``.
    ``cache`` ``None`` = prefix caching off; ``pool``: the paged engine's pool (default ``cache``;
    needed when the cache is off). ``sampling``: the run's temperature / top-p / seed / ignore_eos
    (each request brings its own ``max_tokens``; default greedy). ``name``: the model name the backend
    reports (default ``loaded.name``). The run's ``run.engine`` metadata is ``backend.engine.describe()``.

    Raises:
        InputError: a bad combination or an unsupported setting (one line naming the flag).
    """
    from kvbench.backends.inprocess import InProcessBackend
    from kvbench.engine.factory import EngineConfig, make_engine
    from kvbench.engine.sampling import SamplingParams

    sized = pool or cache
    host_tier = (
        host_tier_blocks(flags.host_tier, loaded.kv_layout(sized.block_size).bytes_per_block) if sized else 0
    )
    config = checked(
        lambda: EngineConfig(
            flags.engine,
            cache=cache,
            pool=pool,
            verify=verify,
            salt=salt,
            max_num_seqs=flags.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens=flags.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            batch_invariant=flags.batch_invariant,
            host_tier_blocks=host_tier,
            store_views=store_views,
        )
    )
    engine = checked(lambda: make_engine(loaded, config))
    return InProcessBackend(engine, sampling or SamplingParams(), name or loaded.name)


def predicted_cached_tokens(
    requests: Sequence[Request],
    flags: EngineFlags,
    cache: CacheConfig | None,
    concurrency: int,
    ignore_eos: bool,
) -> list[int | None]:
    """Per request, the cached prompt tokens the engine should report, by the replay its spec names
    (``EngineKind.spec.cache_model``; module docstring); with the cache off, kvbench's replay of no
    cache."""
    if cache is None:
        return expected_cached_tokens(requests, cache)
    predict = _PREDICTORS[flags.engine.spec.cache_model]
    return predict(requests, flags, cache, concurrency, ignore_eos)


def _predicted_by_cache(
    requests: Sequence[Request], flags: EngineFlags, cache: CacheConfig, concurrency: int, ignore_eos: bool
) -> list[int | None]:
    """:attr:`CacheModel.PREFIX_CACHE`: kvbench's cache replayed alone (exact)."""
    return expected_cached_tokens(requests, cache)


def _predicted_by_pool(
    requests: Sequence[Request], flags: EngineFlags, cache: CacheConfig, concurrency: int, ignore_eos: bool
) -> list[int | None]:
    """:attr:`CacheModel.KV_POOL`: the vLLM-faithful pool, or ``None`` per request where it cannot be
    exact (concurrency, EOS, TTL, head-first release, a host tier; module docstring)."""
    if flags.host_tier is not None:  # the pool simulator has no host tier (kvbench sim --tier models one)
        return [None] * len(requests)
    if (
        concurrency != 1
        or not ignore_eos
        or cache.ttl_s is not None
        or cache.release_order.value != "tail-first"
    ):
        return [None] * len(requests)
    pool = VllmPoolConfig(cache.capacity_blocks + NUM_NULL_BLOCKS, cache.block_size, cache.hash, cache.kind)
    # a request larger than the pool is refused by the engine before it touches a block (an error row,
    # no prediction); the others are predicted as if it had not been sent
    fits = [
        -(-(r.num_tokens + r.max_tokens - 1) // cache.block_size) <= cache.capacity_blocks for r in requests
    ]
    exact = [replace(r, output_tokens=r.max_tokens) for r, fit in zip(requests, fits) if fit]
    predicted = iter(expected_cached_tokens(exact, pool))
    return [next(predicted) if fit else None for fit in fits]


_PREDICTORS = {CacheModel.PREFIX_CACHE: _predicted_by_cache, CacheModel.KV_POOL: _predicted_by_pool}


def verify_metadata(engine) -> dict | None:
    """The ``run.verify_logits`` metadata after a ``--verify`` run on the paged engine: greedy tokens
    compared, argmax flips near ties, mismatches, the largest logprob difference and the tie tolerance
    (:mod:`kvbench.engine.paged.verify`); ``None`` for the copy engine (exact: no tolerance to report)."""
    report = engine.verify_report
    return report.as_dict() if report is not None else None
