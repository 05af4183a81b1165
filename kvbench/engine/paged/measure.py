"""The paged engine measured where ``kvbench memory`` replays: real runs, the pool read by :mod:`.held`.

:func:`measure_parallel_sampling` is ``kvbench memory sharing --engine paged``: ``n`` samples of one
prompt on a fresh engine whose pool never runs out (``SharingConfig.num_unshared_peak_blocks``
blocks), sampled at temperature 1 with the config's seed (sample ``i`` with ``seed + i``), every sample
decoding exactly ``max_tokens`` tokens (``ignore_eos``), as the block-manager replay
(:func:`kvbench.memory.sharing.simulate_parallel_sampling`) assumes. The engine computes the K/V of
``prompt + max_tokens - 1`` tokens per sample (the last sampled token's is never needed) where the
replay counts ``prompt + max_tokens``, so the two peaks differ by one block per sample exactly when
``(prompt + max_tokens) % block_size == 1``.

:func:`measure_waste` is ``kvbench memory waste --engine paged``: a trace's requests on the paged
engine, the running blocks and their unfilled slots (internal fragmentation) read every step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import check_request
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
        num_shared_prompt_blocks: prompt blocks at ref count > 1 right after the fork (read in the
            engine when sample 0's first token arrives): shared as the replay's
            ``BlockManager.num_shared_blocks`` and vLLM's copy-on-write count it, so 0 for ``n = 1``.
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
    check_fits(loaded, config)
    n = config.num_sequences
    engine = PagedEngine(loaded, PagedConfig(CacheConfig(config.num_unshared_peak_blocks, config.block_size)))
    prompt = np.random.default_rng(config.seed).integers(0, loaded.vocab_size, config.prompt_tokens)
    sampling = SamplingParams(
        max_tokens=config.max_tokens, temperature=1.0, seed=config.seed, ignore_eos=True
    )
    shared: list[int] = []

    def on_token(sample: int, _token_id: int) -> None:  # the worker thread, right after the fork
        if sample == 0 and not shared:
            parent, pool = engine.scheduler.running[0], engine.scheduler.pool
            shared.append(sum(pool.ref_count(block_id) > 1 for block_id in parent.block_table))

    start_s = time.perf_counter()
    records = [future.result() for future in engine.submit_samples(prompt, sampling, n, on_token=on_token)]
    elapsed_s = time.perf_counter() - start_s
    engine.wait_idle()
    if records[0].status is not Status.OK:
        raise InputError(
            f"--prompt-tokens {config.prompt_tokens} --max-tokens {config.max_tokens}: {records[0].error}"
        )
    memory, per_block = engine.memory_summary(), engine.kv_pool.bytes_per_block
    return MeasuredSharing(
        config=config,
        model_name=loaded.name,
        bytes_per_block=per_block,
        num_shared_prompt_blocks=shared[0],
        num_copies=engine.scheduler.num_copied_blocks,
        peak_running_blocks=memory["peak_running_kv_bytes"] // per_block,
        peak_held_blocks=memory["peak_held_kv_bytes"] // per_block,
        num_used_blocks_after_free=engine.scheduler.pool.num_used_blocks,
        num_output_tokens=tuple(record.output_tokens for record in records),
        elapsed_s=elapsed_s,
    )


def check_fits(loaded: LoadedModel, config: SharingConfig) -> None:
    """Refuse, before anything runs or prints, a request the engine would refuse: prompt + max_tokens
    beyond ``loaded``'s context (:func:`kvbench.engine.engine.check_request`, both engines' rule).

    Raises:
        InputError: naming --prompt-tokens and --max-tokens.
    """
    problem = check_request(loaded, [0] * config.prompt_tokens, SamplingParams(max_tokens=config.max_tokens))
    if problem is not None:
        raise InputError(
            f"--prompt-tokens {config.prompt_tokens} --max-tokens {config.max_tokens}: {problem}"
        )


@dataclass(frozen=True)
class MeasuredWaste:
    """What a trace held in the paged engine's pool (``kvbench memory waste --engine paged``).

    Attributes:
        model_name, bytes_per_token: the engine's model and its KV bytes per token.
        num_blocks: the pool's blocks (``--pool`` bytes // bytes per block).
        num_served / num_refused: requests that finished / the engine refused (too long for the model
            or the pool).
        mean_running_bytes / peak_running_bytes: bytes of blocks running sequences hold (the replay's
            "reserved"), mean over engine steps and peak.
        mean_unfilled_bytes / peak_unfilled_bytes: their slots holding no token (internal
            fragmentation), mean over steps and peak.
        num_preemptions: sequences preempted and recomputed.
        num_steps: engine steps; elapsed_s: wall time of the run.
    """

    model_name: str
    bytes_per_token: int
    num_blocks: int
    num_served: int
    num_refused: int
    mean_running_bytes: float
    peak_running_bytes: int
    mean_unfilled_bytes: float
    peak_unfilled_bytes: int
    num_preemptions: int
    num_steps: int
    elapsed_s: float


def measure_waste(
    loaded: LoadedModel, requests, pool_bytes: int, block_size: int, seed: int = 0
) -> MeasuredWaste:
    """Run ``requests`` (:class:`kvbench.memory.waste.WasteRequest`: arrival, prompt and output lengths)
    on a paged engine whose pool holds ``pool_bytes``: each is submitted at its arrival time (real
    time from the start; the replay's decode rate stands for this engine's), with random prompt ids of
    its length, decoding exactly its output length (``ignore_eos``); prefix caching off, so the pool
    holds only running sequences, as the replay's paged allocator does.

    Raises:
        InputError: ``pool_bytes`` holds no block of this model.
    """
    per_block = loaded.kv_layout(block_size).bytes_per_block
    num_blocks = pool_bytes // per_block
    if num_blocks < 1:
        raise InputError(f"--pool: {pool_bytes:,} bytes hold no {per_block:,}-byte block of {loaded.name}")
    engine = PagedEngine(loaded, PagedConfig(CacheConfig(num_blocks, block_size), prefix_caching=False))
    rng = np.random.default_rng(seed)
    futures, start_s = [], time.perf_counter()
    for request in sorted(requests, key=lambda r: r.arrival_ms):
        time.sleep(max(0.0, request.arrival_ms / 1e3 - (time.perf_counter() - start_s)))
        prompt = rng.integers(0, loaded.vocab_size, request.prompt_tokens)
        futures.append(
            engine.submit(prompt, SamplingParams(max_tokens=request.output_tokens, ignore_eos=True))
        )
    records = [future.result() for future in futures]
    engine.wait_idle()
    meter, steps = engine.meter, max(engine.meter.num_steps, 1)
    num_served = sum(record.status is Status.OK for record in records)
    return MeasuredWaste(
        model_name=loaded.name,
        bytes_per_token=per_block // block_size,
        num_blocks=num_blocks,
        num_served=num_served,
        num_refused=len(records) - num_served,
        mean_running_bytes=meter.sum_running_bytes / steps,
        peak_running_bytes=meter.peak_running_bytes,
        mean_unfilled_bytes=meter.sum_unfilled_bytes / steps,
        peak_unfilled_bytes=meter.peak_unfilled_bytes,
        num_preemptions=engine.scheduler.num_preemptions,
        num_steps=meter.num_steps,
        elapsed_s=time.perf_counter() - start_s,
    )
