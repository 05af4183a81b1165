"""A ZMQ publisher of KV cache events in vLLM's wire format, with vLLM's replay socket.

The behaviour of vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``): a PUB socket sends
each batch as ``(topic, seq as 8 bytes big-endian, payload)``, ``seq`` counting batches from 0; the
last ``buffer_steps`` payloads are kept, and a ROUTER socket answers a request carrying a start
sequence number (8 bytes big-endian) with every kept ``(seq, payload)`` from it on, then
``(-1, b"")``. Events are queued by any thread (:meth:`EventPublisher.publish`: a deque append, what
the cache's listener costs the engine) and sent by the publisher's own thread, which owns the
sockets: each pass sends what has queued since the last one as one batch, a chain of stored blocks
merged into one ``BlockStored``, as vLLM sends one batch per scheduler step.

One difference: vLLM *connects* its PUB socket to a non-wildcard ``tcp://`` endpoint and binds only
``*``, ``::``, ``ipc://`` and ``inproc://`` ones; kvbench always binds (a server publishes, clients
subscribe), so ``tcp://127.0.0.1:5557`` is reachable on the loopback only. Port 0 binds a free port;
:attr:`EventPublisher.endpoint` is the address bound.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from urllib.parse import urlsplit

import zmq

from kvbench.errors import InputError
from kvbench.events.wire import END_SEQ, BlockStored, Encoding, Event, encode_batch

POLL_S = 0.005  # the thread's pass: a stored block reaches subscribers within a few ms


@dataclass(frozen=True)
class PublisherConfig:
    """vLLM's ``KVEventsConfig`` fields kvbench serve reads, plus the event ``encoding``.

    Raises (constructor): ``ValueError`` for a non-positive ``buffer_steps`` or ``hwm``.
    """

    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000  # batches kept for replay (vLLM's default)
    hwm: int = 100_000  # ZMQ high-water mark of the PUB socket (vLLM's default)
    encoding: Encoding = Encoding.TAGGED

    def __post_init__(self) -> None:
        if self.buffer_steps < 1 or self.hwm < 1:
            raise ValueError("buffer_steps and hwm must be positive")


def _with_port(endpoint: str, offset: int) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or parts.port is None:
        raise InputError(f"--kv-events {endpoint}: expected tcp://HOST:PORT")
    port = parts.port + offset if parts.port else 0
    return f"tcp://{parts.netloc.rsplit(':', 1)[0]}:{port}"


def parse_kv_events(value: str, encoding: Encoding = Encoding.TAGGED) -> PublisherConfig:
    """``--kv-events``: ``tcp://HOST:PORT`` (the replay socket on PORT + 1; port 0 binds two free
    ports) or vLLM's ``--kv-events-config`` JSON (``publisher`` must be ``zmq``; its
    ``enable_kv_cache_events``, ``max_queue_size`` are accepted and ignored; ``encoding`` may be
    added). Raises ``InputError`` naming what is wrong."""
    if not value.lstrip().startswith("{"):
        _with_port(value, 0)
        return PublisherConfig(value, _with_port(value, 1), encoding=encoding)
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as exc:
        raise InputError(f"--kv-events: not JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise InputError("--kv-events: the JSON must be an object (vLLM's KVEventsConfig)")
    if raw.pop("publisher", "zmq") != "zmq" or raw.pop("enable_kv_cache_events", True) is False:
        raise InputError("--kv-events: only the zmq publisher, enabled, is served")
    raw.pop("max_queue_size", None)
    known = {f.name for f in fields(PublisherConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InputError(
            f"--kv-events: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    try:
        config = PublisherConfig(**{**raw, "encoding": Encoding(raw.get("encoding", encoding))})
    except (TypeError, ValueError) as exc:
        raise InputError(f"--kv-events: {exc}") from None
    _with_port(config.endpoint.replace("*", "0.0.0.0"), 0)
    return config


def coalesce(events: list[Event]) -> list[Event]:
    """Merge runs of ``BlockStored`` where each continues the chain of the one before (same medium,
    its parent the last block stored) into one event, as vLLM reports a request's new blocks."""
    merged: list[Event] = []
    for event in events:
        last = merged[-1] if merged else None
        if (
            isinstance(event, BlockStored)
            and isinstance(last, BlockStored)
            and last.medium == event.medium
            and event.parent_block_hash == last.block_hashes[-1]
        ):
            merged[-1] = replace(
                last,
                block_hashes=last.block_hashes + event.block_hashes,
                token_ids=last.token_ids + event.token_ids,
            )
        else:
            merged.append(event)
    return merged


def _bind(socket: zmq.Socket, endpoint: str) -> str:
    """Bind (port 0: a free port); returns the endpoint bound."""
    parts = urlsplit(endpoint.replace("*", "0.0.0.0"))
    socket.bind(f"tcp://{endpoint[6:].rsplit(':', 1)[0]}:*" if parts.port == 0 else endpoint)
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)


class EventPublisher:
    """Publishes queued events from its own thread (module docstring); :meth:`close` stops it.

    Raises (constructor): ``InputError`` when an endpoint cannot be bound.
    """

    def __init__(self, config: PublisherConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay = self._context.socket(zmq.ROUTER) if config.replay_endpoint else None
        try:
            self.endpoint = _bind(self._pub, config.endpoint)
            self.replay_endpoint = _bind(self._replay, config.replay_endpoint) if self._replay else None
        except zmq.ZMQError as exc:
            self._context.destroy(linger=0)
            raise InputError(f"--kv-events: cannot bind {config.endpoint}: {exc}") from None
        self._topic = config.topic.encode()
        self._pending: deque[Event] = deque()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0
        self._idle = threading.Event()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)
        self._thread.start()

    @property
    def num_batches(self) -> int:
        """Batches sent so far (the next one's sequence number)."""
        return self._next_seq

    def publish(self, event: Event) -> None:
        """Queue one event (any thread)."""
        self._idle.clear()
        self._pending.append(event)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued event has been sent; ``False`` on timeout."""
        return self._idle.wait(timeout_s) if self._pending else True

    def close(self) -> None:
        """Send what is queued, stop the thread, close the sockets (idempotent)."""
        if self._running:
            self._running = False
            self._thread.join(timeout=2.0)
            self._context.destroy(linger=0)

    def _loop(self) -> None:
        poller = zmq.Poller()
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        while self._running or self._pending:
            if self._replay is not None and poller.poll(0):
                self._serve_replay()
            if self._pending:
                self._send_pending()
            else:
                self._idle.set()
                time.sleep(POLL_S)

    def _send_pending(self) -> None:
        events = [self._pending.popleft() for _ in range(len(self._pending))]
        payload = encode_batch(self._clock(), coalesce(events), self.config.encoding)
        seq = self._next_seq
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self._next_seq = seq + 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return  # not a replay request (vLLM logs and ignores it too)
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))

    def source_info(self, host: str | None = None) -> dict:
        """This publisher as vLLM's ``GET /kv_event_sources`` describes one rank (its
        ``KVEventsConfig`` fields), the bound endpoints with a wildcard host replaced by ``host``."""

        def shown(endpoint: str | None) -> str | None:
            if endpoint is None or host is None:
                return endpoint
            for wildcard in ("0.0.0.0", "[::]", "*"):
                endpoint = endpoint.replace(f"//{wildcard}:", f"//{host}:")
            return endpoint

        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": shown(self.endpoint),
            "replay_endpoint": shown(self.replay_endpoint),
            "buffer_steps": self.config.buffer_steps,
            "hwm": self.config.hwm,
            "topic": self.config.topic,
            "encoding": self.config.encoding.value,
        }
