"""Where an engine's prefix cache takes a block listener (:mod:`kvbench.cache.events`), for either kind.

The copy engine keeps its prefix cache in ``engine.cache`` (the hash cache tells a listener; the radix
cache does not yet); the paged engine keys the blocks of its one pool through
``engine.scheduler.index`` and, with ``--host-tier``, a host tier at ``engine.scheduler.host``. Code
outside ``engine/`` calls these two functions and never asks which engine it holds.
"""

from __future__ import annotations

from collections.abc import Hashable

from kvbench.cache.events import MEDIUM_CPU, MEDIUM_GPU, BlockListener
from kvbench.errors import InputError


def _targets(engine) -> list[tuple[str, object]]:
    """``(medium, cache)`` pairs that hold a ``listener`` attribute and a ``held_keys()`` method."""
    scheduler = getattr(engine, "scheduler", None)
    if scheduler is not None:
        if scheduler.index is None:
            return []
        host = [(MEDIUM_CPU, scheduler.host)] if scheduler.host is not None else []
        return [(MEDIUM_GPU, scheduler.index), *host]
    cache = getattr(engine, "cache", None)
    if cache is None:
        return []
    if not hasattr(cache, "held_keys"):
        raise InputError(
            "--kv-events: the copy engine's radix cache publishes no events yet; use --cache-kind hash "
            "or --engine paged"
        )
    return [(MEDIUM_GPU, cache)]


def attach_block_listener(engine, listener: BlockListener | None) -> bool:
    """Tell ``listener`` every block ``engine``'s prefix cache stores or drops (``None`` detaches).
    Returns ``False`` when the engine keeps no prefix cache (nothing will be told).

    Raises:
        InputError: the copy engine with the radix cache (it has no listener hooks).
    """
    targets = _targets(engine)
    for _, cache in targets:
        cache.listener = listener
    return bool(targets)


def held_keys(engine) -> dict[str, list[Hashable]]:
    """The key of every block the engine's prefix cache holds, per medium (``"GPU"``, ``"CPU"``);
    a key held by two pool blocks appears twice. Read it between requests: a running engine changes
    the cache meanwhile."""
    held: dict[str, list[Hashable]] = {}
    for medium, cache in _targets(engine):
        keys = (
            cache.pool.held_keys() if medium == MEDIUM_GPU and hasattr(cache, "pool") else cache.held_keys()
        )
        held[medium] = keys
    return held
