"""The paged engine's settings (:class:`PagedConfig`) and vLLM's defaults for its per-step limits."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvbench.cache.base import CacheConfig

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM v1's default token budget per step with chunked prefill


class AttentionKernel(str, Enum):
    """The batched decode's attention kernel (:mod:`kvbench.engine.paged.kernels`); ``auto`` picks at
    start."""

    AUTO = "auto"
    SDPA_GATHERED = "sdpa-gathered"
    FLASHINFER = "flashinfer"
    FLASH_ATTN = "flash-attn"
    KVBENCH_CPU = "kvbench-cpu"


@dataclass(frozen=True)
class PagedConfig:
    """How the paged engine runs.

    Attributes:
        pool: the pool's size (``capacity_blocks``: running and cached blocks together, as vLLM's
            ``num_gpu_blocks`` minus the null block), block size, hash and release order.
        prefix_caching: off = blocks are never keyed or looked up (vLLM's
            ``--no-enable-prefix-caching``); the pool still holds the running sequences.
        max_num_seqs / max_num_batched_tokens: vLLM's per-step limits (sequences, tokens).
        batch_invariant: one forward per sequence, so every output equals its concurrency-1 output.
        verify: check each request against the copy engine with the cache off; ``output_matches_reference``.
            Greedy requests: logits compared, argmax flips near ties told from mismatches
            (:mod:`kvbench.engine.paged.verify`, counts in ``PagedEngine.verify_report``); sampled
            ones: a cache-off rerun's tokens compared.
        salt: the run's salt; a request's own salt replaces it.
        host_tier_blocks: blocks of a host-memory KV tier below the pool (0: none): released blocks are
            written through to it, a GPU miss continues the lookup there and loads the hits back
            (:mod:`kvbench.cache.host_tier`; the inclusive policy of :mod:`kvbench.sim.tiers`).
        attention_kernel: the batched decode's kernel, an :class:`AttentionKernel` or its value;
            ``auto`` = a paged-KV kernel on CUDA where installed, else SDPA over gathered blocks.

    Raises:
        ValueError: a non-positive limit, or a cache
            setting the pool does not implement (verify_tokens, prompt_only). ``pool.kind`` picks the
            pool's block keys (hash or radix, :mod:`kvbench.cache.block_index`); ``pool.ttl_s`` works
            as on the copy engine's caches (:class:`kvbench.cache.pool_cache.IdleTimer`).
    """

    pool: CacheConfig
    prefix_caching: bool = True
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    batch_invariant: bool = False  # batched forwards may differ in the last bits
    verify: bool = False
    salt: str = ""
    host_tier_blocks: int = 0
    attention_kernel: AttentionKernel | str = AttentionKernel.AUTO

    def __post_init__(self) -> None:
        kernels = [kernel.value for kernel in AttentionKernel]
        if self.attention_kernel not in kernels:
            raise ValueError(
                f"attention_kernel: {self.attention_kernel!r} is not one of {', '.join(kernels)}"
            )
        object.__setattr__(self, "attention_kernel", AttentionKernel(self.attention_kernel))
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"--{name.replace('_', '-')}: {value!r} must be a positive integer")
        if self.pool.verify_tokens:
            raise ValueError("--engine paged trusts block hashes (verify_tokens is not implemented)")
        if (
            isinstance(self.host_tier_blocks, bool)
            or not isinstance(self.host_tier_blocks, int)
            or self.host_tier_blocks < 0
        ):
            raise ValueError(f"--host-tier: {self.host_tier_blocks!r} must be a number of blocks >= 0")
        if self.host_tier_blocks and (not self.prefix_caching or self.pool.kind.value != "hash"):
            raise ValueError("--host-tier needs the hash prefix cache on (--cache on --cache-kind hash)")
        if self.pool.prompt_only:
            raise ValueError(
                "--engine paged caches generated blocks as vLLM does: --prompt-only applies to --engine copy"
            )

    @property
    def cache(self) -> CacheConfig | None:
        """The prefix cache's settings, ``None`` when prefix caching is off (the copy engine's field)."""
        return self.pool if self.prefix_caching else None
