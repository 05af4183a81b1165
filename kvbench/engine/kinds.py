"""What each in-process engine kind is: :class:`EngineKind` and its :class:`EngineSpec`, torch-free.

Code outside ``engine/`` never asks which engine it holds (``tests/test_layers.py`` checks): it asks
the kind's spec before an engine is built (``EngineKind.PAGED.spec.has_kv_pool``: flags are checked
before the model loads) and the engine's ``spec`` after (:class:`kvbench.engine.protocol.Engine`).
Everything that differs between the engines and matters outside them is a field here, so a new kind
brings its own answers instead of a new branch in every caller.

Example::

    from kvbench.engine.kinds import EngineKind
    spec = EngineKind.PAGED.spec
    spec.has_kv_pool, spec.batching, spec.max_samples  # (True, True, None)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType


class EngineKind(str, Enum):
    """``copy``: the seed's engine (a block per tensor, hits copied into a contiguous cache, one
    request at a time); ``paged``: one KV pool, block tables, continuous batching
    (:mod:`kvbench.engine.paged`)."""

    COPY = "copy"
    PAGED = "paged"

    @property
    def spec(self) -> EngineSpec:
        """What this kind of engine is (:data:`ENGINE_SPECS`)."""
        return ENGINE_SPECS[self]


DEFAULT_ENGINE_KIND = EngineKind.COPY  # the seed's engine: one request at a time, exact outputs


class CacheModel(str, Enum):
    """Which replay predicts the cached prompt tokens an engine reports
    (:func:`kvbench.sim.predict.expected_cached_tokens`).

    ``prefix-cache``: kvbench's own cache (the run's ``CacheConfig``) replayed alone; only finished
    requests' blocks are in it, so the replay is exact. ``kv-pool``: the vLLM-faithful pool
    (:mod:`kvbench.sim.vllm_pool`), because running and cached blocks share the engine's one KV pool;
    exact only when what runs side by side is known (concurrency 1, every request decoding exactly
    ``max_tokens``), and with no TTL, head-first release or host tier (that pool models none of them).
    """

    PREFIX_CACHE = "prefix-cache"
    KV_POOL = "kv-pool"


@dataclass(frozen=True)
class EngineSpec:
    """What one engine kind is, for the code that builds, serves and predicts around it.

    Attributes:
        has_kv_pool: running and cached blocks share one KV pool, which needs a pool config (its size
            and block size) even with the prefix cache off.
        batching: several sequences run at once (continuous batching): the engine's running / waiting
            counts are the server's gauges, and a request still queued waits in the engine's scheduler,
            so an abandoned one is aborted there (``Engine.abort``).
        max_samples: most parallel samples (``n``) of one prompt; ``None``: no limit of its own.
        cache_model: which replay predicts its cached prompt tokens (:class:`CacheModel`).
        unsupported_settings: the engine flags it does not implement, by their ``EngineFlags`` field
            name (``host_tier`` for ``--host-tier``), in the order the CLI names the first one given.
        unsupported_breaks: the break experiments it cannot run (``kvbench break NAME``) and why,
            one line each.
    """

    has_kv_pool: bool
    batching: bool
    max_samples: int | None
    cache_model: CacheModel
    unsupported_settings: tuple[str, ...] = ()
    unsupported_breaks: Mapping[str, str] = field(default_factory=dict, hash=False)  # a mapping: not hashable

    def __post_init__(self) -> None:
        object.__setattr__(self, "unsupported_breaks", MappingProxyType(dict(self.unsupported_breaks)))


PAGED_SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "host_tier", "batch_invariant")

ENGINE_SPECS: Mapping[EngineKind, EngineSpec] = MappingProxyType(
    {
        EngineKind.COPY: EngineSpec(
            has_kv_pool=False,  # each cached block is its own tensor; a request's KV is its own
            batching=False,  # one request at a time, first in first out
            max_samples=1,  # one sequence per request
            cache_model=CacheModel.PREFIX_CACHE,
            unsupported_settings=PAGED_SETTINGS,  # the scheduler's limits and the pool's host tier
        ),
        EngineKind.PAGED: EngineSpec(
            has_kv_pool=True,
            batching=True,
            max_samples=None,  # forks of one prefill, copy-on-write
            cache_model=CacheModel.KV_POOL,
            unsupported_breaks={
                "views": "views shows the copy engine's cached blocks as views of a request's whole KV "
                "tensor; the paged engine's blocks are slots of one preallocated pool, so there is no "
                "view to leak",
                "tiny-hash": "tiny-hash counts false hits with a lockstep replica of the copy engine's "
                "cache; on the paged engine running blocks share the pool, which that replica does "
                "not model",
            },
        ),
    }
)


def engines_supporting(setting: str) -> str:
    """``--engine K`` for every kind that implements ``setting`` (an ``EngineFlags`` field name),
    joined with ``or``: the end of a "applies to ... only" message."""
    return " or ".join(
        f"--engine {kind.value}" for kind in EngineKind if setting not in kind.spec.unsupported_settings
    )
