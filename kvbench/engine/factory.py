"""The one way to build an in-process engine: :func:`make_engine` from one frozen :class:`EngineConfig`.

Example::

    from kvbench.cache.base import CacheConfig
    from kvbench.engine.factory import EngineConfig, EngineKind, make_engine
    from kvbench.engine.model import load_model
    engine = make_engine(load_model(), EngineConfig(EngineKind.PAGED,
    cache=CacheConfig(capacity_blocks=4096)))
    record = engine.submit(token_ids, SamplingParams(max_tokens=32)).result()

The engine returned implements :class:`kvbench.engine.protocol.Engine`; callers never ask which kind
it is: what differs between kinds is in the kind's spec (:mod:`kvbench.engine.kinds`). A new kind plugs
in with an :class:`EngineKind` member, its :class:`~kvbench.engine.kinds.EngineSpec` and a builder in
``_BUILDERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.cache.base import CacheConfig, Clock
from kvbench.engine.kinds import DEFAULT_ENGINE_KIND, EngineKind
from kvbench.engine.paged.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS

if TYPE_CHECKING:  # torch stays unimported until an engine is built (the CLI imports EngineKind)
    from kvbench.engine.model import LoadedModel
    from kvbench.engine.protocol import Engine


@dataclass(frozen=True)
class EngineConfig:
    """Everything that decides how an engine runs, for every kind.

    Attributes:
        kind: which engine.
        cache: the prefix cache's settings (capacity, block size, kind, TTL, release order, hash);
            ``None`` runs with prefix caching off.
        pool: paged: the KV pool's settings (its ``capacity_blocks`` hold running and cached blocks
            together, as vLLM's); ``None`` = ``cache``. Needed when ``cache`` is ``None``: the pool
            still holds the running sequences.
        verify: check every request against a cache-off run (``output_matches_reference``).
        salt: the run's salt; a request's own salt replaces it ("" = the public namespace).
        max_num_seqs / max_num_batched_tokens: paged: vLLM's per-step limits (its defaults).
        batch_invariant: paged: one forward per sequence, exact against concurrency 1.
        host_tier_blocks: paged: blocks of a host-memory KV tier below the pool (0: none).
        store_views: copy: cache views instead of per-block copies (the ``views`` break's memory bug).

    Raises:
        ValueError: a paged engine with neither ``cache`` nor ``pool``; a paged-only setting on the
            copy engine. (Each engine's own config checks the rest when :func:`make_engine` builds it.)
    """

    kind: EngineKind = DEFAULT_ENGINE_KIND
    cache: CacheConfig | None = None
    pool: CacheConfig | None = None
    verify: bool = False
    salt: str = ""
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    batch_invariant: bool = False  # batched forwards may differ in the last bits
    host_tier_blocks: int = 0
    store_views: bool = False  # off: each cached block owns exactly its bytes
    # (room for per-kind switches of the forward, e.g. a compiled forward, beside these)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EngineKind(self.kind))
        if self.kind.spec.has_kv_pool and self.pool is None and self.cache is None:
            raise ValueError(
                f"--engine {self.kind.value} needs a KV pool: give EngineConfig a cache or a pool"
            )
        if self.kind is EngineKind.COPY and (self.batch_invariant or self.host_tier_blocks):
            raise ValueError("batch_invariant and host_tier_blocks apply to --engine paged only")

    @property
    def pool_config(self) -> CacheConfig | None:
        """The paged engine's pool: ``pool``, else ``cache``."""
        return self.pool if self.pool is not None else self.cache


def _copy_engine(loaded: LoadedModel, config: EngineConfig, clock: Clock | None) -> Engine:
    from kvbench.engine.engine import CopyConfig, HFEngine

    return HFEngine(
        loaded,
        CopyConfig(
            cache=config.cache, store_views=config.store_views, verify=config.verify, salt=config.salt
        ),
        clock,
    )


def _paged_engine(loaded: LoadedModel, config: EngineConfig, clock: Clock | None) -> Engine:
    from kvbench.engine.paged.config import PagedConfig
    from kvbench.engine.paged.engine import PagedEngine

    paged = PagedConfig(
        config.pool_config,
        prefix_caching=config.cache is not None,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        batch_invariant=config.batch_invariant,
        verify=config.verify,
        salt=config.salt,
        host_tier_blocks=config.host_tier_blocks,
    )
    return PagedEngine(loaded, paged, clock)


_BUILDERS: dict[EngineKind, Callable[[LoadedModel, EngineConfig, Clock | None], Engine]] = {
    EngineKind.COPY: _copy_engine,
    EngineKind.PAGED: _paged_engine,
}


def make_engine(
    loaded: LoadedModel, config: EngineConfig = EngineConfig(), clock: Clock | None = None
) -> Engine:
    """The engine ``config.kind`` names over ``loaded``. ``clock`` (seconds) is the cache's TTL clock,
    injectable for tests; latencies always use ``time.perf_counter``.

    Raises:
        ValueError: a setting that engine does not implement (e.g. ``verify_tokens`` or ``prompt_only``
            on the paged engine), one line naming the flag.
        InputError: the model cannot run on that engine (non-attention layers; not a transformers model).
    """
    return _BUILDERS[config.kind](loaded, config, clock)
