"""Connection limits of ``kvbench serve``: a flood of connections never exhausts file descriptors.

uvicorn accepts every connection and times out only idle keep-alive ones: a client that dribbles its
request headers (slowloris) holds a descriptor for ever, and a flood of them ended in 118,697 log lines
of ``OSError: [Errno 24] Too many open files`` from the accept loop. Here, in front of
uvicorn's own HTTP protocol (:func:`server_config`):

* **header timeout**: a connection that has not sent a whole request head within
  ``header_timeout_s`` of connecting is closed (nginx's ``client_header_timeout``);
* **body timeout**: a connection whose request body stops arriving (no byte for ``body_timeout_s``
  while the head's ``Content-Length`` or chunks promise more) is closed (nginx's
  ``client_body_timeout``): headers with ``Content-Length: 100000`` then 9 bytes held a connection
  for ever;
* **idle keep-alive**: uvicorn's ``timeout_keep_alive``, ``keep_alive_s``;
* **a cap on open connections**: at ``max_connections``, each new connection closes the oldest
  connection that has no request in progress or whose body is still arriving (a slow or idle
  client); when every one is busy, the new
  one gets a 503 (an ``overloaded_error`` body, :data:`~kvbench.server.error_shapes.OVERLOADED_BODY`)
  and is closed. The cap stays below the process's open-file limit, so ``accept``
  never fails;
* **one log line per condition** (uvicorn's ``uvicorn.error`` logger, a warning): when the cap is
  first reached (again once the connections fell under half of it) and when a slow client is first
  closed, never one line per connection.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from kvbench.server.error_shapes import OVERLOADED_BODY

DEFAULT_MAX_CONNECTIONS = 1024  # far above 128 concurrent streaming clients; see connection_cap()
DEFAULT_HEADER_TIMEOUT_S = 10.0  # a real client sends its request head in milliseconds
DEFAULT_KEEP_ALIVE_S = 5.0  # uvicorn's default timeout_keep_alive
DEFAULT_BODY_TIMEOUT_S = 10.0  # between two reads of a body; nginx's client_body_timeout is 60 s
STOP_GRACE_S = 5.0  # on SIGTERM/SIGINT, the longest uvicorn waits for responses (kvbench.server.stopping)
RESERVED_DESCRIPTORS = 64  # kept for the model's files, logs and the listening socket
_SERVICE_UNAVAILABLE = (  # no request read yet: a body both OpenAI's and Anthropic's SDKs parse
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(OVERLOADED_BODY)}\r\nconnection: close\r\n\r\n".encode()
    + OVERLOADED_BODY
)
logger = logging.getLogger("uvicorn.error")


@dataclass(frozen=True)
class ConnectionLimits:
    """Attributes: ``max_connections`` open at once (positive); ``header_timeout_s`` to send a request
    head after connecting, ``keep_alive_s`` idle between requests and ``body_timeout_s`` without a
    byte of a request body that promises more (seconds, positive)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be positive, got {self.max_connections}")
        if not (self.header_timeout_s > 0 and self.keep_alive_s > 0 and self.body_timeout_s > 0):
            raise ValueError("the header, body and keep-alive timeouts must be positive seconds")


def connection_cap(requested: int | None) -> int:
    """The cap for ``--max-connections`` (``None``: :data:`DEFAULT_MAX_CONNECTIONS`), at most the
    soft open-file limit minus :data:`RESERVED_DESCRIPTORS`. Raises ``ValueError`` if ``requested``
    is above that limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = max(soft - RESERVED_DESCRIPTORS, 1) if soft != resource.RLIM_INFINITY else DEFAULT_MAX_CONNECTIONS
    if requested is None:
        return min(DEFAULT_MAX_CONNECTIONS, room)
    if requested > room:
        raise ValueError(
            f"{requested} is above this process's open-file limit (ulimit -n {soft}) "
            f"minus {RESERVED_DESCRIPTORS}: at most {room}"
        )
    return requested


class _Watch:
    """One server's open connections (oldest first) and which conditions were logged."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open: dict[Any, None] = {}  # insertion-ordered: the oldest connection first
        self.logged: set[str] = set()

    def once(self, condition: str, message: str) -> None:
        if condition not in self.logged:
            self.logged.add(condition)
            logger.warning("kvbench serve: %s", message)

    def opened(self, connection: Any) -> bool:
        """Track ``connection``; ``False`` if it must be refused (every open one is busy)."""
        self.open[connection] = None
        if len(self.open) <= self.limits.max_connections:
            return True
        self.once(
            "cap",
            f"{self.limits.max_connections:,} open connections (--max-connections): each new one "
            "closes the oldest idle or slow one (logged once)",
        )
        idle = next((c for c in self.open if c is not connection and _idle(c)), None)
        if idle is None:
            del self.open[connection]
            return False
        del self.open[idle]
        idle.transport.close()
        return True

    def closed(self, connection: Any) -> None:
        self.open.pop(connection, None)
        if len(self.open) < self.limits.max_connections // 2:
            self.logged.discard("cap")


def _idle(connection: Any) -> bool:
    """No request in progress: none started yet (a slow request head), its body still arriving (a
    slow body), or the last one answered."""
    cycle = connection.cycle
    return cycle is None or cycle.response_complete or _body_due(connection)


def _body_due(connection: Any) -> bool:
    """A request head was read and its body is not whole yet."""
    cycle = connection.cycle
    return cycle is not None and cycle.more_body and not cycle.response_complete


def _protocol(watch: _Watch) -> type:
    """uvicorn's HTTP protocol class with ``watch``'s limits (the module docstring)."""

    class LimitedProtocol(AutoHTTPProtocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if not watch.opened(self):
                transport.write(_SERVICE_UNAVAILABLE)
                transport.close()
                return
            self.head_timer = self.loop.call_later(watch.limits.header_timeout_s, self.head_overdue)
            self.body_timer: Any = None

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.body_timer is not None:
                self.body_timer.cancel()
                self.body_timer = None
            if _body_due(self) and not self.transport.is_closing():  # progress: the clock starts again
                self.body_timer = self.loop.call_later(watch.limits.body_timeout_s, self.body_overdue)

        def body_overdue(self) -> None:
            self.body_timer = None
            if not _body_due(self) or self.transport.is_closing():
                return
            if self.flow.read_paused:  # the app has not read what came: not the client's delay
                self.body_timer = self.loop.call_later(watch.limits.body_timeout_s, self.body_overdue)
                return
            watch.once(
                "slow body",
                f"closing connections whose request body stalled for {watch.limits.body_timeout_s:g} s "
                "(--body-timeout; logged once)",
            )
            self.transport.close()

        def head_overdue(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                watch.once(
                    "slow",
                    f"closing connections that sent no whole request head within "
                    f"{watch.limits.header_timeout_s:g} s (--header-timeout; logged once)",
                )
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            watch.closed(self)
            for timer in (getattr(self, "head_timer", None), getattr(self, "body_timer", None)):
                if timer is not None:
                    timer.cancel()
            super().connection_lost(exc)

    return LimitedProtocol


def server_config(app: Any, log_level: str, limits: ConnectionLimits = ConnectionLimits()) -> uvicorn.Config:
    """The uvicorn config every ``kvbench serve`` runs with (the command and the tests' servers)."""
    return uvicorn.Config(
        app,
        log_level=log_level,
        lifespan="off",
        http=_protocol(_Watch(limits)),
        timeout_keep_alive=limits.keep_alive_s,
        timeout_graceful_shutdown=STOP_GRACE_S,
    )  # type: ignore[arg-type]
