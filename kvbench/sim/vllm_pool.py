"""vLLM-faithful accounting: predict the ``cached_tokens`` vLLM v1 reports for every request.

``kvbench.sim.replay`` answers "what hit rate does a cache of N blocks give"; this module answers "what will
vLLM say for request 17", which needs vLLM's whole KV pool, not just a prefix cache. It replays a
trace sequentially (concurrency 1: each request finishes before the next one is scheduled) through a
model of vLLM's block pool. The rules, each with its source in vLLM v1 (file names under ``vllm/``;
checked against vLLM 0.32.0 and against a live server, see ``kvbench/peer``):

1. **Capacity is the whole KV pool.** ``num_gpu_blocks`` blocks (what the server logs; set with
   ``--num-gpu-blocks-override`` or sized from ``VLLM_CPU_KVCACHE_SPACE``), of which block 0 is the
   null block that never holds KV (``v1/core/block_pool.py``: ``BlockPool.__init__`` pops it). Cached
   blocks live in the same pool as running requests' blocks: there is no separate cache size.
2. **A running request holds blocks for its prompt and its output.** Prefill allocates
   ``ceil(prompt / B)`` blocks minus the hit; each decode step allocates a block when the token whose
   KV it computes starts a new block. KV is computed for ``prompt + output - 1`` tokens: the last
   sampled token ends the request before it is fed back (``v1/core/kv_cache_manager.py``:
   ``allocate_slots``; ``v1/core/single_type_kv_cache_manager.py``: ``allocate_new_blocks``).
3. **Full blocks are hashed and cached, output blocks included.** After every step the request's full
   blocks, up to the tokens computed, enter the hash table (``cache_blocks`` ->
   ``BlockPool.cache_full_blocks``), so ``(prompt + output - 1) // B`` blocks end up cached. Output
   tokens come from the model, not the trace, so the simulator gives blocks holding output tokens
   unique keys (they occupy the pool but never hit) unless the output ids are passed in.
4. **Lookup** walks the prompt's block hashes from block 0 and stops at the first miss, at most
   ``(prompt - 1) // B`` blocks: the hit is capped at ``prompt - 1`` tokens and floored to the block
   size (``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length = request.num_tokens - 1``;
   ``FullAttentionManager.find_longest_cache_hit``). Hit blocks sitting in the free queue are taken
   out of it (``BlockPool.touch``). ``cached_tokens`` = hit blocks x B, fixed at first scheduling
   (``Request.num_cached_tokens``).
5. **Free, tail first, into an LRU free queue.** A finished request's blocks are released in reverse
   order (``SingleTypeKVCacheManager.free``); blocks whose ref count reaches 0 go to the *end* of the
   free queue if they are cached, to the *front* if not (``BlockPool.free_blocks``: unhashed blocks are
   reused first, cached ones in LRU order, a chain's tail before its head).
6. **Eviction is lazy.** A cached block in the free queue keeps its hash until an allocation pops it
   from the front (``BlockPool.get_new_blocks`` -> ``_maybe_evict_cached_block``); only then can it no
   longer hit. Duplicate blocks with one hash may coexist (``BlockHashToBlockMap``).
7. **Salt.** vLLM mixes ``cache_salt`` into block 0's extra keys (``v1/core/kv_cache_utils.py``:
   ``generate_block_hash_extra_keys``); kvbench's block hasher roots the chain in the salt. Both give
   one namespace per salt, which is all a prediction needs.
8. **Counters**: ``vllm:prefix_cache_queries`` grows by the prompt length and ``..._hits`` by the
   hit, per request (``KVCacheManager.record_prefix_cache_stats``).

**Radix mode** (``kind="radix"``): the same pool keyed as a radix tree over token ids, as the paged
engine's ``--cache-kind radix`` (:mod:`kvbench.cache.block_index`, the one index class both use): a
block's key is ``(parent block, token bytes)``, and a block computed a second time is deduplicated
when keyed (the table switches to the tree's block, the copy is freed: SGLang's
``cache_unfinished_req``); eviction is still the pool's, which is then the LRU unpinned leaf. The
replay keys and allocates block by block in the engine's order (prefill, then one decode token at a
time), because a deduplicated block is free again for the next allocation. Output blocks of unknown
ids get placeholder contents derived from the whole prompt: equal prompts give equal outputs (greedy
or seeded decoding), so their output blocks deduplicate too, as they do on the engine.

Not modelled: concurrent requests (batching order, preemption, the admission watermark), chunked
prefill interleaving other requests, hybrid (sliding-window, Mamba) models, speculative decoding and
KV connectors. At concurrency 1 none of them changes which blocks are cached.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.cache.base import CacheKind
from kvbench.cache.block_hash import BlockHash, BlockHasher, HashConfig
from kvbench.cache.block_index import PoolIndex
from kvbench.cache.block_pool import BlockPool
from kvbench.request import Request

NUM_NULL_BLOCKS = 1  # vLLM's BlockPool reserves block 0 as the null block


@dataclass(frozen=True)
class VllmPoolConfig:
    """vLLM's KV pool, as the server was started.

    Attributes:
        num_gpu_blocks: blocks in the pool as vLLM logs them (``num_gpu_blocks``; on the CPU backend
            "# CPU blocks"), the null block included; at least 2.
        block_size: tokens per block (``--block-size``).
        hash: how kvbench computes prompt block keys; any collision-free hash predicts vLLM's
            (only equality of keys matters).
        kind: ``hash`` (vLLM) or ``radix`` (the paged engine's radix mode; module docstring).
    """

    num_gpu_blocks: int
    block_size: int = 16  # vLLM's default --block-size (the CPU backend needs a multiple of 32)
    hash: HashConfig = field(default_factory=HashConfig)
    kind: CacheKind = CacheKind.HASH

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CacheKind(self.kind))
        if (
            isinstance(self.num_gpu_blocks, bool)
            or not isinstance(self.num_gpu_blocks, int)
            or self.num_gpu_blocks <= NUM_NULL_BLOCKS
        ):
            raise ValueError(
                f"num_gpu_blocks must be an integer > {NUM_NULL_BLOCKS}, got {self.num_gpu_blocks!r}"
            )
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size <= 0:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that hold KV: the pool minus the null block."""
        return self.num_gpu_blocks - NUM_NULL_BLOCKS


@dataclass
class VllmSimResult:
    """Per-request predictions and totals of one sequential replay.

    Attributes:
        block_size / num_gpu_blocks: the pool simulated.
        cached_tokens: predicted ``usage.prompt_tokens_details.cached_tokens`` per request; shape (n,).
        prompt_tokens: prompt lengths; shape (n,).
        num_evicted_blocks: cached blocks whose hash was dropped to make room.
        num_cached_blocks_at_end: blocks still holding a hash after the last request.
    """

    block_size: int
    num_gpu_blocks: int
    cached_tokens: np.ndarray
    prompt_tokens: np.ndarray
    num_evicted_blocks: int
    num_cached_blocks_at_end: int

    @property
    def num_requests(self) -> int:
        return int(self.prompt_tokens.shape[0])

    @property
    def prefix_cache_queries_tokens(self) -> int:
        """What ``vllm:prefix_cache_queries_total`` grows by over the replay (tokens)."""
        return int(self.prompt_tokens.sum())

    @property
    def prefix_cache_hits_tokens(self) -> int:
        """What ``vllm:prefix_cache_hits_total`` grows by over the replay (tokens)."""
        return int(self.cached_tokens.sum())

    @property
    def token_hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens (vLLM's counter ratio)."""
        queries = self.prefix_cache_queries_tokens
        return self.prefix_cache_hits_tokens / queries if queries else 0.0


class VllmSimulator:
    """Replays requests one at a time through a :class:`~kvbench.cache.block_pool.BlockPool` whose ids
    start after the null block, empty blocks reused first (module docstring, rules 1-8).

    Example::

        simulator = VllmSimulator(VllmPoolConfig(num_gpu_blocks=64, block_size=32))
        cached = [simulator.run(request) for request in requests]
    """

    def __init__(self, config: VllmPoolConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_usable_blocks, first_block_id=NUM_NULL_BLOCKS)
        self._hasher = BlockHasher(config.block_size, config.hash)
        self.index = PoolIndex(self.pool, self._hasher, config.kind)
        self._unique_keys = itertools.count()

    def run(self, request: Request, output_token_ids: Sequence[int] | None = None) -> int:
        """Schedule, run and free one request; returns its predicted ``cached_tokens``.

        ``request.output_tokens`` is the exact number of generated tokens (send ``max_tokens`` with
        ``ignore_eos``). ``output_token_ids``, if known, make output blocks hashable like prompt ones.

        Raises:
            ValueError: no output length, or the request needs more blocks than the pool has free
                (vLLM would never schedule it).
        """
        num_output = request.output_tokens
        if num_output is None or num_output < 1:
            raise ValueError("the vLLM simulator needs each request's exact output_tokens (>= 1)")
        block_size, pool = self.config.block_size, self.pool
        num_prompt = request.num_tokens
        keys = self._block_keys(request, num_output, output_token_ids)
        tokens = (
            request.token_ids
            if output_token_ids is None
            else np.concatenate((request.token_ids, np.asarray(output_token_ids, dtype=np.uint32)))
        )  # read by a listener on the index (the block's token ids of its stored event)
        hit = self._lookup(keys, (num_prompt - 1) // block_size, request.salt or "")
        num_kv_tokens = num_prompt + num_output - 1  # rule 2: the last sampled token's KV is never computed
        num_blocks = -(-num_kv_tokens // block_size)
        num_evictable_hits = sum(pool.ref_count(b) == 0 for b in hit)
        if num_blocks - len(hit) + num_evictable_hits > pool.num_free_blocks:
            raise ValueError(
                f"a request of {num_kv_tokens} tokens needs {num_blocks} blocks; the pool has "
                f"{self.config.num_usable_blocks} usable blocks ({pool.num_free_blocks} free after hits)"
            )
        pool.touch(hit)
        blocks = hit + pool.allocate(-(-num_prompt // block_size) - len(hit))  # the prefill's blocks
        for index in range(len(hit), num_prompt // block_size):  # rule 3: every full block
            self.index.key_block(blocks, index, keys, request.salt or "", tokens)
        for position in range(num_prompt, num_kv_tokens):  # decode: a block when one starts, a key when full
            if position % block_size == 0:
                blocks += pool.allocate(1)
            if (position + 1) % block_size == 0:
                self.index.key_block(blocks, position // block_size, keys, request.salt or "", tokens)
        pool.free(blocks[::-1])  # rule 5: tail first
        return len(hit) * block_size

    def _lookup(self, keys: Sequence[Hashable], max_hit_blocks: int, salt: str) -> list[int]:
        return self.index.cached_prefix(keys[:max_hit_blocks], salt)

    def _block_keys(
        self, request: Request, num_output: int, output_token_ids: Sequence[int] | None
    ) -> list[Hashable]:
        """Keys of every full block of prompt + output (:meth:`PoolIndex.block_keys`); blocks with
        unknown output tokens get unique keys (hash) or contents derived from the prompt (radix)."""
        block_size, salt = self.config.block_size, request.salt or ""
        if output_token_ids is not None:
            if len(output_token_ids) != num_output:
                raise ValueError(f"got {len(output_token_ids)} output ids for {num_output} output tokens")
            tokens = np.concatenate((request.token_ids, np.asarray(output_token_ids, dtype=np.uint32)))
            return self.index.block_keys(tokens, salt)
        keys = self.index.block_keys(request.token_ids, salt)
        num_unknown = (request.num_tokens + num_output) // block_size - len(keys)
        if self.config.kind is CacheKind.RADIX:
            prompt_digest = hashlib.sha256(np.asarray(request.token_ids, dtype=np.uint32).tobytes()).digest()
            return keys + [("output", prompt_digest, index) for index in range(num_unknown)]
        unique = (BlockHash(b"kvbench/output/%d" % next(self._unique_keys)) for _ in range(num_unknown))
        return keys + list(unique)


def simulate_vllm(
    requests: Sequence[Request],
    config: VllmPoolConfig,
    output_token_ids: Sequence[Sequence[int] | None] | None = None,
) -> VllmSimResult:
    """Replay ``requests`` in order (concurrency 1) through a fresh vLLM pool; see the module docstring.

    Raises:
        ValueError: a request lacks ``output_tokens`` or cannot fit in the pool.
    """
    simulator = VllmSimulator(config)
    outputs = output_token_ids if output_token_ids is not None else [None] * len(requests)
    cached = np.array([simulator.run(r, o) for r, o in zip(requests, outputs, strict=True)], dtype=np.int64)
    prompt = np.array([r.num_tokens for r in requests], dtype=np.int64)
    pool = simulator.pool
    return VllmSimResult(
        block_size=config.block_size,
        num_gpu_blocks=config.num_gpu_blocks,
        cached_tokens=cached,
        prompt_tokens=prompt,
        num_evicted_blocks=pool.num_evicted_blocks,
        num_cached_blocks_at_end=pool.num_cached_blocks,
    )
