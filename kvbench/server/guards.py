"""The checks every request to ``kvbench serve`` passes before any route sees it (one ASGI middleware).

In order, each refusal an error body in its route's shape (:mod:`kvbench.server.error_shapes`: OpenAI's
``{"error": {"message", "type", "param", "code"}}``, Anthropic's on ``/v1/messages``):

1. **Host** (400, as Starlette's ``TrustedHostMiddleware`` answers): the ``Host``
   header must name an allowed host. Bound to a loopback address, only that address and ``localhost``
   are allowed, which stops DNS rebinding (a web page whose own hostname resolves to 127.0.0.1 reaching
   a loopback server); bound to a wildcard address (``0.0.0.0``, ``::``), any host, unless the operator
   lists hosts (``--allowed-host``; ``*`` allows any).
2. **API key** (401): with ``--api-key``, every route except ``/health`` needs
   ``Authorization: Bearer KEY``, as ``vllm serve --api-key`` does, or ``x-api-key: KEY``, the header
   Anthropic's API and SDK use. Compared in constant time.
3. **Content type** (415): a POST with a non-empty body must say ``application/json`` (or no content
   type at all). A browser's cross-site "simple request" (``text/plain``, form encodings) can reach a
   server without a CORS preflight; it never reaches ``/reset_prefix_cache`` or a generation route.
   An empty body (``curl -X POST``, kvbench's own admin client) needs no content type.
4. **Body size** (413): at most ``max_body_bytes`` (32 MiB by default, ``--max-body-size``). A declared
   ``Content-Length`` above it is refused before one byte is read; otherwise the body is read (on the
   event loop, which keeps serving other connections meanwhile) and refused when it passes the limit.
   The read body is handed to the route unchanged; later ``receive`` calls go to the client, so the
   routes still see ``http.disconnect``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kvbench.server.error_shapes import error_body

# 32 MiB: a 128k-token prompt is ~0.5 MiB of text; far above any real request
DEFAULT_MAX_BODY_BYTES = 32 << 20
UNGUARDED_PATHS = ("/health",)  # what a load balancer probes without a key (vLLM leaves /health open too)
ANY_HOST = "*"
_GONE = object()  # _read_body: the client disconnected before its body was complete

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class GuardConfig:
    """What :class:`Guards` enforces.

    Attributes:
        max_body_bytes: the largest request body accepted, in bytes; positive.
        api_key: the bearer token every route but ``/health`` needs; ``None`` = no key.
        allowed_hosts: host names (without port) the ``Host`` header may carry; ``("*",)`` = any.
    """

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    api_key: str | None = None
    allowed_hosts: tuple[str, ...] = (ANY_HOST,)

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("the API key must not be empty")

    @classmethod
    def for_bind(cls, host: str, allowed_hosts: tuple[str, ...] = (), **kwargs: Any) -> GuardConfig:
        """The config for a server bound to ``host``: ``allowed_hosts`` when given, else only the bound
        address (plus ``localhost`` for loopback); a wildcard bind allows any host."""
        if not allowed_hosts:
            allowed_hosts = _hosts_of_bind(host)
        return cls(allowed_hosts=tuple(name.lower() for name in allowed_hosts), **kwargs)


def _hosts_of_bind(host: str) -> tuple[str, ...]:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return (host,)  # bound by name: that name
    if address.is_unspecified:
        return (ANY_HOST,)
    names = (str(address), f"[{address}]") if address.version == 6 else (str(address),)
    return (*names, "localhost") if address.is_loopback else names


def _host_name(header: str) -> str:
    """``Host`` without its port: ``127.0.0.1:8000`` -> ``127.0.0.1``, ``[::1]:80`` -> ``[::1]``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guards:
    """ASGI middleware applying :class:`GuardConfig` (see the module docstring) in front of ``app``."""

    def __init__(self, app: Callable, config: GuardConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]
        }
        path = scope["path"]
        problem = self._header_problem(scope, headers)
        if problem is not None:
            return await _refuse(send, path, *problem)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.config.max_body_bytes:
            return await _refuse(send, path, *self._too_large())
        body = await self._read_body(receive)
        if body is _GONE:
            return None  # the client left before its body arrived: nothing to answer
        if body is None:
            return await _refuse(send, path, *self._too_large())
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if (
            body
            and content_type
            and not (content_type == "application/json" or content_type.endswith("+json"))
        ):
            return await _refuse(
                send,
                path,
                415,
                f"request bodies must be JSON (Content-Type: application/json), got {content_type!r}",
                None,
                "unsupported_media_type",
            )
        return await self.app(scope, _replay(body, receive), send)

    def _header_problem(self, scope: Scope, headers: dict[str, str]) -> tuple | None:
        allowed = self.config.allowed_hosts
        if ANY_HOST not in allowed and _host_name(headers.get("host", "")) not in allowed:
            return (
                400,
                (
                    f"Host {headers.get('host', '')!r} is not served here (allowed: {', '.join(allowed)}; "
                    "kvbench serve --allowed-host NAME adds one)"
                ),
                None,
                "invalid_host",
            )
        key = self.config.api_key
        if key is not None and scope["path"] not in UNGUARDED_PATHS:
            bearer = hmac.compare_digest(headers.get("authorization", "").encode(), f"Bearer {key}".encode())
            anthropic = hmac.compare_digest(headers.get("x-api-key", "").encode(), key.encode())
            if not (bearer or anthropic):
                return (
                    401,
                    "a valid API key is needed: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
                    None,
                    "invalid_api_key",
                )
        return None

    def _too_large(self) -> tuple:
        limit = self.config.max_body_bytes
        return (
            413,
            f"the request body is larger than this server's limit of {limit:,} bytes "
            "(kvbench serve --max-body-size)",
            None,
            "request_too_large",
        )

    async def _read_body(self, receive: Receive) -> bytes | None | object:
        """The whole body; ``None`` once it passes the limit; ``_GONE`` if the client left first."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return _GONE
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.config.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then the client's own messages (disconnects)."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _refuse(send: Send, path: str, status: int, message: str, param: str | None, code: str) -> None:
    payload = json.dumps(error_body(path, status, message, param, code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
