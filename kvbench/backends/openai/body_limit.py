"""Request bodies a server refuses for their size, found before the run.

A server that limits request bodies (``kvbench serve --max-body-size``, 32 MiB by default; nginx's
``client_max_body_size``, 1 MiB by default) answers 413 as soon as it reads a ``Content-Length``
above its limit and closes the connection, while the client is still writing: the client then sees
"Connection reset by peer", never the 413. So before the run, when the largest body is over
``PROBE_ABOVE_BYTES``, kvbench sends that request's headers alone (``Content-Length`` of the real
body, no body) and waits up to ``PROBE_WAIT_S`` for an early answer: a 413 is the server's answer to
that size, shown as it came. A server that waits for the body says nothing: the probe leaves and the
run goes on (the limit is not known).
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from kvbench.request import Request

PROBE_ABOVE_BYTES = 64 << 10  # smaller bodies pass every common limit (nginx's default is 1 MiB)
PROBE_WAIT_S = 2.0
MAX_MESSAGE_CHARS = 300


def body_bytes(backend, request: Request) -> int:
    """The size of ``request``'s JSON body as ``backend`` (an ``OpenAIBackend``) sends it, bytes."""
    _, arguments = backend.request_arguments(request)
    extra = arguments.pop("extra_body", {})
    arguments.pop("extra_headers", None)  # headers, not body
    return len(json.dumps({**arguments, **extra}, default=str).encode())


def endpoint_path(base_url: str, chat: bool) -> str:
    return urlsplit(base_url).path.rstrip("/") + ("/chat/completions" if chat else "/completions")


def early_answer(base_url: str, key: str, path: str, num_bytes: int) -> tuple[int, str] | None:
    """``(status, message)`` when the server answers a ``num_bytes`` body's headers before its body
    (a 4xx such as 413), else ``None`` (no answer within ``PROBE_WAIT_S``, or no connection)."""
    parts = urlsplit(base_url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=PROBE_WAIT_S)
    try:
        connection.putrequest("POST", path)
        for name, value in (
            ("Content-Type", "application/json"),
            ("Content-Length", str(num_bytes)),
            ("Authorization", f"Bearer {key}"),
        ):
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, _message(response.read(64 << 10))
    except (TimeoutError, OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def _message(body: bytes) -> str:
    """The error message of an OpenAI-style error body, else the body's text (one line)."""
    text = body.decode(errors="replace")
    try:
        data = json.loads(text)
        text = data["error"]["message"] if isinstance(data.get("error"), dict) else data.get("detail", text)
    except (ValueError, AttributeError, KeyError, TypeError):
        pass
    return " ".join(str(text).split())[:MAX_MESSAGE_CHARS]


def oversized_body(backend, requests: list[Request], key: str) -> str | None:
    """One line naming the largest request and the server's answer when the server refuses its body
    size before the run (module docstring), else ``None``."""
    if not requests:
        return None
    sizes = [(body_bytes(backend, request), request) for request in requests]
    num_bytes, request = max(sizes, key=lambda pair: pair[0])
    if num_bytes <= PROBE_ABOVE_BYTES:
        return None
    chat, _ = backend.request_arguments(request)
    answer = early_answer(
        backend.config.base_url, key, endpoint_path(backend.config.base_url, chat), num_bytes
    )
    if answer is None or answer[0] != 413:
        return None
    return (
        f"request {request.request_id}: its body is {num_bytes:,} bytes and the server refuses that size "
        f"before the run: HTTP {answer[0]}: {answer[1]} (shorten the prompts or raise the server's limit)"
    )
