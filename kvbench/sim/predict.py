"""THE expected-cached-tokens predictor: what a server's prefix cache should report per request.

One function, :func:`expected_cached_tokens`, for every caller that needs a prediction (the run's
``expected_cached_tokens`` column, the OpenAI backend's reconciliation, the break experiments, the
vLLM peer). The requests are replayed **in request order** (the send loop's order; at concurrency 1
a correct server serves them so), one at a time, and the model is chosen by the type of ``cache``:

* ``None``: the cache is off; every request is predicted 0.
* :class:`~kvbench.cache.base.CacheConfig`: kvbench's prefix cache (:func:`kvbench.sim.replay.simulate`:
  lookup capped at ``(prompt - 1) // block_size`` blocks, insert every full block after the hit,
  release tail first), hash or radix, of ``capacity_blocks`` blocks. Unless ``prompt_only``, each
  request stores prompt + output - 1 tokens, as the engine does: the output ids given, else
  placeholders of the request's output length (:mod:`kvbench.sim.outputs`). With a TTL the prediction is
  ``None`` per request: the engine's TTL runs on wall time, which a replay cannot know.
* :class:`Unbounded`: the same cache large enough never to evict
  (:func:`kvbench.sim.bounds.unbounded_capacity_blocks`): the ideal. Generated blocks are stored
  only where ``outputs`` gives them (placeholders cannot hit and take no room that matters).
* :class:`~kvbench.sim.vllm_pool.VllmPoolConfig`: the vLLM-faithful pool (whole KV pool, output
  blocks included, lazy eviction; :mod:`kvbench.sim.vllm_pool`); needs each request's exact
  ``output_tokens``.

A request's ``salt`` is its cache namespace; ``None`` is the public namespace ``""``.

:class:`OnlinePrediction` is the same prediction for a :class:`CacheConfig` made one request at a
time, when each request's output is known only once it finished (``kvbench run --turns live``): the
same step (:func:`kvbench.sim.step.step`) and the same stored blocks
(:func:`kvbench.sim.outputs.stored_blocks`), in the order the caller gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.cache.base import CacheConfig, CacheKind, make_cache
from kvbench.cache.block_hash import BlockHasher, HashConfig
from kvbench.request import Request
from kvbench.sim.bounds import unbounded_capacity_blocks
from kvbench.sim.outputs import Outputs, known_outputs, stored_blocks, stored_blocks_of
from kvbench.sim.replay import PreparedTrace, prompt_blocks_of, simulate
from kvbench.sim.step import step
from kvbench.sim.vllm_pool import VllmPoolConfig, simulate_vllm


@dataclass(frozen=True)
class Unbounded:
    """A prefix cache that never evicts: its capacity is every full block of the requests replayed
    (prompt and output).

    Attributes:
        block_size: tokens per block; positive (16 is vLLM's default).
        kind: hash table or radix tree (they agree when nothing is evicted).
        hash: how block keys are computed.

    Raises:
        ValueError: a non-positive block size or an unknown kind.
    """

    block_size: int = 16  # vLLM's default block size
    kind: CacheKind = CacheKind.HASH
    hash: HashConfig = field(default_factory=HashConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CacheKind(self.kind))
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")

    def cache_config(self, requests: Sequence[Request], outputs: Outputs | None = None) -> CacheConfig:
        """The bounded cache this is for ``requests``: room for every full block of each prompt, or of
        prompt + output - 1 tokens where ``outputs`` gives the request's output ids."""
        lengths = [r.num_tokens for r in requests]
        if outputs is not None:
            lengths = [n + max(len(o) - 1, 0) if o is not None else n for n, o in zip(lengths, outputs)]
        capacity = unbounded_capacity_blocks(lengths, self.block_size)
        return CacheConfig(
            capacity_blocks=capacity,
            block_size=self.block_size,
            kind=self.kind,
            hash=self.hash,
            prompt_only=outputs is None,
        )


CacheModel = CacheConfig | Unbounded | VllmPoolConfig | None


def expected_cached_tokens(
    requests: Sequence[Request], cache: CacheModel, outputs: Outputs | None = None
) -> list[int | None]:
    """Predicted cached prompt tokens per request, same order as ``requests`` (module docstring).

    ``requests`` need ``token_ids``, ``salt`` and, for the vLLM pool, ``output_tokens``; their
    ``arrival_s`` is not used (request order is the replay's time). Values are multiples of the block
    size; ``None`` where the model cannot know (a TTL). ``outputs``: per request, the generated ids
    (from a run, :func:`kvbench.sim.outputs.record_outputs`, or a trace's replies,
    :func:`~kvbench.sim.outputs.trace_outputs`) or ``None``; unknown ones get placeholders.

    Raises:
        ValueError: the vLLM pool without a request's ``output_tokens``, or a request that does not
            fit in the pool.
        TypeError: ``cache`` is none of the models above.
    """
    if cache is None:
        return [0] * len(requests)
    if isinstance(cache, VllmPoolConfig):
        return [int(value) for value in simulate_vllm(requests, cache, outputs).cached_tokens]
    ideal = isinstance(cache, Unbounded)
    if ideal:  # never evicts: only known outputs can change a hit, so no placeholders
        cache = cache.cache_config(requests, outputs)
    if not isinstance(cache, CacheConfig):
        raise TypeError(
            f"cache must be a CacheConfig, Unbounded, VllmPoolConfig or None, got {type(cache).__name__}"
        )
    if cache.ttl_s is not None:
        return [None] * len(requests)  # the engine's TTL runs on wall time, a replay's on trace time
    keep_tokens = cache.kind is CacheKind.RADIX or cache.verify_tokens
    prompts = prompt_blocks_of(requests, cache.block_size, cache.hash, keep_tokens=keep_tokens)
    stored = None
    if not cache.prompt_only:
        given = outputs if ideal else known_outputs(requests, outputs)
        stored = stored_blocks_of(requests, given, cache.block_size, cache.hash, keep_tokens)
    positions = np.arange(len(requests), dtype=np.float64)  # request order as time
    result = simulate(PreparedTrace(prompts, positions, cache.block_size, stored), cache)
    return [int(value) for value in result.cached_tokens_per_request]


class OnlinePrediction:
    """Expected cached tokens one finished request at a time, through one cache (module docstring).

    Unlike :func:`expected_cached_tokens` the caller decides, per request, what is stored: the
    output ids it learned (``None``: the prompt's blocks alone, no placeholders) and whether anything
    is (a failed request stores nothing). The cache's TTL runs on the wall clock, as the server's
    does beside it.

    Args:
        cache: the cache to replay; ``None`` (caching off) predicts 0 for every request.
        store_outputs: ``False`` stores the prompt's blocks only (``kvbench serve --prompt-only``).
    """

    def __init__(self, cache: CacheConfig | None, store_outputs: bool = True) -> None:
        self.config, self.store_outputs = cache, store_outputs
        self.cache = make_cache(cache) if cache is not None else None
        self.hasher = BlockHasher(cache.block_size, cache.hash) if cache is not None else None
        self.keep_tokens = cache is not None and (cache.kind is CacheKind.RADIX or cache.verify_tokens)

    def finished(self, request: Request, output_ids: Sequence[int] | None, store: bool = True) -> int:
        """The request's cached tokens (a multiple of the block size); with ``store`` its blocks
        (prompt + ``output_ids`` - 1 tokens, or the prompt's alone) are stored after the hit."""
        if self.cache is None:
            return 0
        salt = request.salt or ""
        prompt = self.hasher.prompt_blocks(request.token_ids, salt=salt, keep_tokens=self.keep_tokens)
        output = output_ids if self.store_outputs else None
        stored = stored_blocks(self.hasher, request, output, self.keep_tokens) if store else None
        return step(self.cache, prompt, stored, store=store).num_hit_tokens
