"""The ``kvbench run --backend openai`` flags that shape every request for a fleet behind a router.

A router decides per request which replica serves it; the keys it can hash on must be in the
request. By default the trace's session goes out as the ``X-Session-ID`` header and as OpenAI's
``user`` field (vllm-router 0.1.17's ``consistent_hash`` reads ``X-Session-ID``, ``session-id`` and
``user``); without them every request of a consistent-hash fleet lands on one worker.

* ``--session-header NAME``: the header that carries the session (``none``: no header).
* ``--header K:V`` (repeatable): more headers on every request (e.g. sglang-router's
  ``x-smg-routing-key``, an auth header a gateway needs).
* ``--extra-body JSON``: a JSON object merged into every request body (it wins over the fields kvbench
  sets, except the ones that decide what the stream is: ``model``, ``messages``, ``prompt``, ``stream``).
* ``--replica-metrics URL`` (repeatable): each replica's own root, scraped before and after
  (:mod:`kvbench.run.replica_metrics`).
* ``--kv-events SRC`` (repeatable): a replica's KV cache events, read during the run
  (:mod:`kvbench.run.kv_events`).

Each flag is checked where :class:`~kvbench.run.config.ServerFlags` is built: a bad value is a
``ValueError`` naming the flag.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from kvbench.backends.openai.client import OpenAIConfig
    from kvbench.run.config import ServerFlags

TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP header name (RFC 9110 "token")
NO_SESSION_HEADER = "none"
UNKNOWN_MODEL = "unknown"  # sglang-router's model id for workers it could not ask
OWNED_BY_KVBENCH = ("model", "messages", "prompt", "stream")  # what the stream is: not --extra-body's


def session_header(value: str | None) -> str | None:
    """The session header's name: ``X-Session-ID`` for ``None``, no header for ``none`` or empty.
    Raises ``ValueError`` for a name that is not an HTTP token."""
    from kvbench.backends.openai.client import SESSION_HEADER

    if value is None:
        return SESSION_HEADER
    if value.strip().lower() in ("", NO_SESSION_HEADER):
        return None
    if not TOKEN.fullmatch(value.strip()):
        raise ValueError(f"--session-header {value!r}: not an HTTP header name (or 'none')")
    return value.strip()


def parse_headers(values: tuple[str, ...]) -> dict[str, str]:
    """``--header NAME:VALUE`` values as a dict (a later name wins). Raises ``ValueError`` for a value
    without ``:``, a name that is not an HTTP token, or a value with control or non-Latin-1 characters."""
    headers: dict[str, str] = {}
    for item in values:
        name, colon, value = item.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not TOKEN.fullmatch(name):
            raise ValueError(f"--header {item!r}: give NAME:VALUE with an HTTP header name")
        if any(ord(char) < 32 or ord(char) == 127 or ord(char) > 255 for char in value):
            raise ValueError(f"--header {item!r}: the value has a control or non-Latin-1 character")
        headers[name] = value
    return headers


def parse_extra_body(text: str | None) -> dict[str, Any]:
    """``--extra-body`` as a dict (``{}`` for ``None``). Raises ``ValueError`` for text that is not a
    JSON object, or one that sets a field in :data:`OWNED_BY_KVBENCH`."""
    if text is None:
        return {}
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--extra-body: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ValueError(f"--extra-body: give a JSON object, e.g. '{{\"priority\": 1}}', got {text!r}")
    if owned := sorted(set(body) & set(OWNED_BY_KVBENCH)):
        raise ValueError(f"--extra-body: {', '.join(owned)} is set by kvbench from the trace")
    return body


def check_replica_urls(urls: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming ``--replica-metrics`` for a URL that is not http(s) with a host, or
    one given twice."""
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"--replica-metrics {url!r}: not an http:// or https:// URL with a host "
                "(a replica's root, e.g. http://127.0.0.1:8001)"
            )
    if len(set(urls)) != len(urls):
        raise ValueError("--replica-metrics: a replica is given twice (its counters would count twice)")


def check_fleet_flags(server: ServerFlags) -> None:
    """Raise ``ValueError`` naming the flag for any bad fleet flag of ``server``."""
    session_header(server.session_header)
    parse_headers(server.header)
    parse_extra_body(server.extra_body)
    check_replica_urls(server.replica_metrics)
    from kvbench.run.kv_events import check_kv_event_targets

    check_kv_event_targets(server.kv_events)
    if server.fleet_policy is None:
        if server.fleet_replicas is not None:
            raise ValueError("--fleet-replicas applies with --fleet-policy (the router's policy)")
        return
    from kvbench.route.expect import model_of

    model_of(server.fleet_policy)
    if not (server.fleet_replicas or server.replica_metrics):
        raise ValueError("--fleet-policy needs --fleet-replicas N or one --replica-metrics URL per replica")


def shaped(config: OpenAIConfig, server: ServerFlags) -> OpenAIConfig:
    """``config`` with the fleet flags applied: ``--header``, ``--session-header`` and ``--extra-body``
    (merged over the body fields ``config`` already adds)."""
    return replace(
        config,
        headers={**config.headers, **parse_headers(server.header)},
        session_header=session_header(server.session_header),
        extra_body={**config.extra_body, **parse_extra_body(server.extra_body)},
    )


def fleet_expectations(server: ServerFlags, requests, server_cache, expectations, say):
    """``(expectations, metadata)``: with ``--fleet-policy``, the expected cached tokens per request
    from ``kvbench route``'s model of that policy over the fleet's replicas, each with the cache the
    server's own expectation assumed (:mod:`kvbench.route.expect`); ``metadata`` is the result file's
    ``fleet_expectation`` (``None`` without the flag). A policy without a model keeps one cache's
    expectation and says so through ``say``."""
    if server.fleet_policy is None:
        return expectations, None
    from kvbench.backends.openai.reconcile import Expectations
    from kvbench.cache.base import CacheConfig
    from kvbench.route.expect import fleet_expectation

    num_replicas = server.fleet_replicas or len(server.replica_metrics)
    block_size = expectations.block_size
    if server_cache.model is None:  # caching off: nothing to route for
        return expectations, None
    capacity = expectations.capacity_blocks or 1 + sum(p.num_full_blocks for p in expectations.prompts)
    cache = CacheConfig(capacity, block_size)
    fleet = fleet_expectation(requests, cache, server.fleet_policy, num_replicas, server.replica_metrics)
    if fleet is None:
        say(
            f"expected cached tokens: one cache (kvbench route has no model of --fleet-policy "
            f"{server.fleet_policy})"
        )
        return expectations, None
    say(
        f"expected cached tokens: kvbench route's {fleet.model} over {num_replicas} replicas "
        "(the router's --fleet-policy; exact at concurrency 1)"
    )
    metadata = {"policy": fleet.policy, "model": fleet.model, "num_replicas": num_replicas}
    metadata["request_index"] = [r.index for r in requests]
    metadata["replica"] = fleet.replica
    narrowed = Expectations(
        expectations.prompts,
        fleet.cached_tokens,
        block_size,
        expectations.capacity_blocks,
        f"{fleet.model} over {num_replicas} replicas",
    )
    return narrowed, metadata


def replicas_model(server: ServerFlags, key: str) -> str:
    """The model the replicas behind a router list (``--replica-metrics``), for a router that lists
    its own as ``unknown``. Raises ``InputError`` naming ``--model`` when no replica says."""
    from kvbench.backends.openai.admin import list_models
    from kvbench.errors import InputError

    for replica in server.replica_metrics:
        models, _ = list_models(replica + "/v1", key)
        if models and models[0] != UNKNOWN_MODEL:
            return models[0]
    raise InputError(
        f"the router at {server.url} lists its model as {UNKNOWN_MODEL!r} (it could not read the "
        "workers' model): give --model NAME, the name the workers serve"
    )
