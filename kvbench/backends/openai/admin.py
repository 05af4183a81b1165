"""Server administration around a run: list models, reset the prefix cache, scrape ``/metrics``.

Each is one small blocking HTTP call through :func:`call` (stdlib ``urllib``; no retries), made
before or after the requests themselves, never between them. Failures never raise: they come back
as ``None`` / a note with the key scrubbed out.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

RESET_ENDPOINTS = ("/reset_prefix_cache", "/flush_cache")  # vLLM (and kvbench serve); SGLang


def redact(text: str, secret: str) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***`` (nothing for empty or dummy keys)."""
    return text.replace(secret, "***") if secret and secret != "EMPTY" else text


def server_root(base_url: str) -> str:
    """The server's root URL: ``base_url`` without a trailing ``/v1`` (where vLLM serves /metrics)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def call(
    url: str, api_key: str, timeout_s: float, method: str = "GET", json_body: dict | None = None
) -> tuple[int, str]:
    """``(HTTP status, body text)`` of one small request (a POST sends ``json_body`` as JSON, else an
    empty body); ``(0, reason)`` when no response came. ``api_key`` goes in a bearer header when non-empty."""
    data = json.dumps(json_body).encode() if json_body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(url, method=method, data=data)
    if json_body is not None:
        request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, redact(str(getattr(exc, "reason", exc)), api_key)


def _problem(status: int, body: str) -> str:
    return f"HTTP {status}" if status else body


def list_models(base_url: str, api_key: str, timeout_s: float = 10.0) -> tuple[list[str], str | None]:
    """``(model ids, None)`` from ``GET /v1/models``, or ``([], why not)``."""
    status, body = call(base_url.rstrip("/") + "/models", api_key, timeout_s)
    if status != 200:
        return [], redact(f"GET /v1/models: {_problem(status, body)}", api_key)
    try:
        return [str(entry["id"]) for entry in json.loads(body)["data"]], None
    except (ValueError, KeyError, TypeError):
        return [], "GET /v1/models: not an OpenAI model list"


def unreachable(base_url: str, api_key: str, timeout_s: float = 10.0) -> str | None:
    """Why no HTTP response came from ``GET /v1/models`` (refused, unknown host, timeout), or
    ``None`` when the server answered at all (any status: a server without /models still serves)."""
    status, body = call(base_url.rstrip("/") + "/models", api_key, timeout_s)
    return body if status == 0 else None


PARTIAL_CONTENT = 206  # sglang-router's /flush_cache when some workers failed ("0 succeeded, 2 failed")


def reset_prefix_cache(base_url: str, api_key: str, timeout_s: float = 30.0) -> tuple[str | None, str]:
    """POST the server's cache-reset endpoint (vLLM's, else SGLang's). Returns ``(endpoint, note)``;
    ``endpoint`` is ``None`` when none answered 2xx (``note`` says what happened). A 206 is a partial
    reset (a router whose fan-out failed on some workers): a failure, with the router's first line."""
    notes = []
    for endpoint in RESET_ENDPOINTS:
        status, body = call(server_root(base_url) + endpoint, api_key, timeout_s, method="POST")
        if status == PARTIAL_CONTENT:
            first = (body.strip().splitlines() or [""])[0][:200]
            notes.append(f"POST {endpoint}: HTTP 206, a partial reset ({first})")
            break
        if 200 <= status < 300:
            return endpoint, f"POST {endpoint}: cache reset"
        notes.append(f"POST {endpoint}: {_problem(status, body)}")
    return None, redact("; ".join(notes), api_key)


def fetch_metrics(base_url: str, api_key: str, timeout_s: float = 10.0) -> str | None:
    """The Prometheus text at the server's ``/metrics`` (``base_url`` with or without ``/v1``), or
    ``None`` when it has none or does not answer. Parse it with :mod:`kvbench.backends.openai.metrics`."""
    status, body = call(server_root(base_url) + "/metrics", api_key, timeout_s)
    return body if status == 200 else None
