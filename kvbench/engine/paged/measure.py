"""The paged engine measured where ``kvbench memory`` replays: real runs, the pool read by :mod:`.held`.

:func:`measure_parallel_sampling` is ``kvbench memory sharing --engine paged``: ``n`` samples of one
prompt on a fresh engine whose pool never runs out (``SharingConfig.num_unshared_peak_blocks``
blocks), sampled at temperature 1 with the config's seed (sample ``i`` with ``seed + i``), every sample
decoding exactly ``max_tokens`` tokens (``ignore_eos``), as the block-manager replay
(:func:`kvbench.memory.sharing.simulate_parallel_sampling`) assumes. The engine computes the K/V of
``prompt + max_tokens - 1`` tokens per sample (the last sampled token's is never needed) where the
replay counts ``prompt + max_tokens``, so the two peaks differ by one block per sample exactly when
``(prompt + max_tokens) % block_size == 1``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kvbench.cache.base import CacheConfig
from kvbench.engine.model import LoadedModel
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import InputError
from kvbench.memory.sharing import SharingConfig
from kvbench.request import Status


@dataclass(frozen=True)
class MeasuredSharing:
    """What one parallel-sampling run held in the paged engine's pool.

    Attributes:
        config: prompt length, tokens per sample, ``n`` (``num_sequences``), block size, seed.
        model_name: the engine's model; ``bytes_per_block``: its K and V of one block, every layer.
        num_shared_prompt_blocks: prompt blocks at ref count ``n`` right after the fork (read in the
            engine when sample 0's first token arrives).
        num_copies: copy-on-write copies (``n - 1`` when the prompt ends mid-block, else 0).
        peak_running_blocks / peak_held_blocks: the pool's running blocks and running + cached blocks
            at their step peaks (:class:`~kvbench.engine.paged.held.PoolMeter`).
        num_used_blocks_after_free: blocks some table still points at once every sample finished (0).
        num_output_tokens: tokens every sample generated, in sample order.
        elapsed_s: wall time of the run (for the reader; not a benchmark).
    """

    config: SharingConfig
    model_name: str
    bytes_per_block: int
    num_shared_prompt_blocks: int
    num_copies: int
    peak_running_blocks: int
    peak_held_blocks: int
    num_used_blocks_after_free: int
    num_output_tokens: tuple[int, ...]
    elapsed_s: float


def measure_parallel_sampling(loaded: LoadedModel, config: SharingConfig) -> MeasuredSharing:
    """Run ``config.num_sequences`` samples of a random ``config.prompt_tokens``-token prompt (module
    docstring) and read the pool.

    Raises:
        InputError: the engine refused the request (prompt + max_tokens beyond the model's context).
    """
    n = config.num_sequences
    engine = PagedEngine(loaded, PagedConfig(CacheConfig(config.num_unshared_peak_blocks, config.block_size)))
    prompt = np.random.default_rng(config.seed).integers(0, loaded.vocab_size, config.prompt_tokens)
    sampling = SamplingParams(max_tokens=config.max_tokens, temperature=1.0, seed=config.seed, ignore_eos=True)
    shared: list[int] = []

    def on_token(sample: int, _token_id: int) -> None:  # the worker thread, right after the fork
        if sample == 0 and not shared:
            parent, pool = engine.scheduler.running[0], engine.scheduler.pool
            shared.append(sum(pool.ref_count(block_id) == n for block_id in parent.block_table))

    start_s = time.perf_counter()
    records = [future.result() for future in engine.submit_samples(prompt, sampling, n, on_token=on_token)]
    elapsed_s = time.perf_counter() - start_s
    engine.wait_idle()
    if records[0].status is not Status.OK:
        raise InputError(f"--prompt-tokens {config.prompt_tokens} --max-tokens {config.max_tokens}: {records[0].error}")
    memory, per_block = engine.memory_summary(), engine.kv_pool.bytes_per_block
    return MeasuredSharing(
        config=config, model_name=loaded.name, bytes_per_block=per_block, num_shared_prompt_blocks=shared[0],
        num_copies=engine.scheduler.num_copied_blocks,
        peak_running_blocks=memory["peak_running_kv_bytes"] // per_block,
        peak_held_blocks=memory["peak_held_kv_bytes"] // per_block,
        num_used_blocks_after_free=engine.scheduler.pool.num_used_blocks,
        num_output_tokens=tuple(record.output_tokens for record in records), elapsed_s=elapsed_s)
