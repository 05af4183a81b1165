"""Building the in-process engine a run asked for (``--engine copy|paged``) and its cached-tokens prediction.

* ``copy``: :class:`kvbench.engine.engine.HFEngine`; predicted by kvbench's cache replay
  (:func:`kvbench.sim.predict.expected_cached_tokens` with the :class:`CacheConfig`).
* ``paged``: :class:`kvbench.engine.paged.engine.PagedEngine`, its pool sized by ``--cache-size``
  (running and cached blocks together, as vLLM's); predicted by the vLLM-faithful pool
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

from kvbench.cache.base import CacheConfig
from kvbench.errors import checked
from kvbench.memory.layout import parse_bytes
from kvbench.request import Request
from kvbench.run.config import EngineFlags, EngineKind
from kvbench.sim.predict import expected_cached_tokens
from kvbench.sim.vllm_pool import NUM_NULL_BLOCKS, VllmPoolConfig


def make_engine(loaded, flags: EngineFlags, pool: CacheConfig, cache_on: bool, verify: bool, salt: str):
    """The engine ``flags.engine`` names over ``loaded``; ``pool`` is the cache config (used as the
    paged engine's pool even when the cache is off). Raises ``InputError`` for a bad combination."""
    from kvbench.engine.engine import EngineConfig, HFEngine

    if flags.engine is EngineKind.COPY:
        return HFEngine(loaded, EngineConfig(cache=pool if cache_on else None, verify=verify, salt=salt))
    from kvbench.engine.paged.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, PagedConfig
    from kvbench.engine.paged.engine import PagedEngine

    config = checked(lambda: PagedConfig(
        pool, prefix_caching=cache_on, max_num_seqs=flags.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=flags.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        batch_invariant=flags.batch_invariant, verify=verify, salt=salt,
        host_tier_blocks=host_tier_blocks(flags.host_tier, loaded.kv_layout(pool.block_size).bytes_per_block)))
    return PagedEngine(loaded, config)


def host_tier_blocks(text: str | None, bytes_per_block: int) -> int:
    """``--host-tier``: blocks (a bare integer) or bytes with a unit (``2GiB``) -> whole blocks; 0 when absent.

    Raises:
        InputError: not a size.
    """
    if text is None:
        return 0
    return int(text) if text.strip().isdigit() else parse_bytes(text) // bytes_per_block


def predicted_cached_tokens(requests: Sequence[Request], flags: EngineFlags, cache: CacheConfig | None,
                            concurrency: int, ignore_eos: bool) -> list[int | None]:
    """Per request, the cached prompt tokens the engine should report (module docstring)."""
    if flags.engine is EngineKind.COPY or cache is None:
        return expected_cached_tokens(requests, cache)
    if flags.host_tier is not None:  # the pool simulator has no host tier (kvbench sim --tier models one)
        return [None] * len(requests)
    if concurrency != 1 or not ignore_eos or cache.ttl_s is not None or cache.release_order.value != "tail-first":
        return [None] * len(requests)
    pool = VllmPoolConfig(cache.capacity_blocks + NUM_NULL_BLOCKS, cache.block_size, cache.hash, cache.kind)
    # a request larger than the pool is refused by the engine before it touches a block (an error row,
    # no prediction); the others are predicted as if it had not been sent
    fits = [-(-(r.num_tokens + r.max_tokens - 1) // cache.block_size) <= cache.capacity_blocks for r in requests]
    exact = [replace(r, output_tokens=r.max_tokens) for r, fit in zip(requests, fits) if fit]
    predicted = iter(expected_cached_tokens(exact, pool))
    return [next(predicted) if fit else None for fit in fits]


def verify_metadata(engine) -> dict | None:
    """The ``run.verify_logits`` metadata after a ``--verify`` run on the paged engine: greedy tokens
    compared, argmax flips near ties, mismatches, the largest logprob difference and the tie tolerance
    (:mod:`kvbench.engine.paged.verify`); ``None`` for the copy engine (exact: no tolerance to report)."""
    report = getattr(engine, "verify_report", None)
    return report.as_dict() if report is not None and engine.config.verify else None


def engine_metadata(flags: EngineFlags, engine) -> dict:
    """The ``run.engine`` metadata of a results file: the kind and, for paged, its limits, pool and
    attention kernel."""
    if flags.engine is EngineKind.COPY:
        return {"kind": "copy"}
    config = engine.config
    return {"kind": "paged", "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens, "batch_invariant": config.batch_invariant,
            "num_pool_blocks": config.pool.capacity_blocks, "pool_bytes": engine.kv_pool.allocated_bytes,
            "host_tier_blocks": config.host_tier_blocks,
            "host_tier_bytes": engine.host_kv.allocated_bytes if engine.host_kv is not None else 0,
            "attention_kernel": engine.attention_kernel.kernel.value,  # engine/paged/kernels.py
            "attention_kernel_reason": engine.attention_kernel.reason}
