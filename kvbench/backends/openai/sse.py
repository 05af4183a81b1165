"""The lean streaming path's reader: a server-sent-event body as raw bytes, each chunk ``json.loads``-ed.

Why: the openai SDK turns every stream chunk into a pydantic object (``construct_type``,
~0.1 ms per chunk on an idle core, ~1.5 ms on this loaded 2-core machine), which capped kvbench's
client at ~14-40 requests/s where a bare client sustains 50-150 (``benchmarks/client_bench.py``).
Here the request still goes through the SDK (``with_streaming_response``: the same base URL, key,
headers, timeout and HTTP status errors), only the body is read differently:

* :class:`EventSplitter`: the event-stream rules as the SDK applies them (``openai/_streaming.py``
  ``SSEDecoder``, after WHATWG HTML "Interpreting an event stream"): lines end at CRLF, LF or CR; a
  blank line dispatches; ``:`` starts a comment; ``data:`` lines join with ``\\n``; one space after
  the colon is dropped; an event is dispatched when it had any field (an event with no data then
  fails to parse as JSON, as it does in the SDK).
* :func:`stream_chunks`: each event's data ``json.loads``-ed to a dict; ``[DONE]`` ends the stream (the
  rest of an HTTP/1.1 body is read for up to 0.1 s so the connection is reused, as the SDK does); a
  chunk with an ``error`` raises ``openai.APIError``; transport errors raise the SDK's
  ``APITimeoutError`` / ``APIConnectionError``, so the backend turns both paths' failures into the
  same one-line errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import openai

try:
    import httpx2 as _http  # the HTTP library of the openai SDK >= 3
except ImportError:  # pragma: no cover - older SDKs use httpx
    import httpx as _http

HTTP_LIBRARY = _http  # the openai SDK's HTTP library (httpx2, or httpx): its exception types
DONE = b"[DONE]"
DRAIN_TIMEOUT_S = 0.1  # the SDK's _DRAIN_TIMEOUT (openai/_streaming_cleanup.py)
TIMEOUT_ERRORS = (_http.TimeoutException,)
# openai/_httpx2.py request_exceptions()
TRANSPORT_ERRORS = (
    _http.RequestError,
    ssl.SSLError,
    anyio.EndOfStream,
)


class EventSplitter:
    """Splits a byte stream into the data of its events (``bytes``; several ``data:`` lines joined
    with ``\\n``). Feed it the body's pieces in order; the piece boundaries may fall anywhere.

    Dispatch follows the SDK's decoder exactly, quirks included: a blank line dispatches an event when
    one was begun (a ``data`` line, a non-empty ``event``, a ``retry`` that is an integer) or when an
    ``id`` was ever seen (the last event id is never reset, per WHATWG), and its data is then ``b""``."""

    def __init__(self) -> None:
        self._buffer = b""  # an unfinished line
        self._skip_lf = False  # the last piece ended in CR: a leading LF belongs to that line
        self._data: list[bytes] = []
        self._event = False  # a non-empty event name since the last dispatch
        self._retry = False  # an integer retry field since the last dispatch
        self._id = False  # a non-empty last event id (kept across dispatches)

    def feed(self, piece: bytes) -> list[bytes]:
        """The data of every event that ``piece`` completes, in order."""
        if (
            not self._buffer
            and not self._data
            and not self._event
            and not self._retry
            and piece.startswith(b"data: ")
            and piece.find(b"\n") == len(piece) - 2
            and piece.endswith(b"\n\n")
            and b"\r" not in piece
        ):
            self._skip_lf = False  # the common case: one whole one-line event per piece
            return [piece[6:-2]]
        if self._skip_lf and piece.startswith(b"\n"):
            piece = piece[1:]
        self._skip_lf = False
        lines = (self._buffer + piece).splitlines(keepends=True)
        self._buffer = b""
        if lines and lines[-1].endswith(b"\r"):
            self._skip_lf = True
        elif lines and not lines[-1].endswith(b"\n"):
            self._buffer = lines.pop()
        events = []
        for line in lines:
            line = line.rstrip(b"\r\n")
            if not line:
                if self._data or self._event or self._retry or self._id:
                    events.append(b"\n".join(self._data))
                self._data, self._event, self._retry = [], False, False
            elif not line.startswith(b":"):
                self._take_field(line)
        return events

    def _take_field(self, line: bytes) -> None:
        name, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = bool(value)
        elif name == b"id" and b"\0" not in value:
            self._id = bool(value)
        elif name == b"retry":
            try:
                int(value.decode("utf-8", "replace"))
                self._retry = True
            except ValueError:
                pass


def _error_event(chunk: Any, request: Any) -> openai.APIError | None:
    """The SDK's error for a chunk that carries ``error`` (its message, or the SDK's default text)."""
    if not isinstance(chunk, dict) or not chunk.get("error"):
        return None
    error = chunk["error"]
    message = error.get("message") if isinstance(error, dict) else None
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return openai.APIError(message, request, body=error)


async def stream_chunks(response: Any) -> AsyncIterator[tuple[Any, float]]:
    """``(chunk, received_s)`` for every event of a streamed response (an SDK ``AsyncAPIResponse``):
    the decoded JSON and the ``perf_counter`` time its bytes arrived. Raises ``openai.APIError`` for
    an error chunk, ``openai.APITimeoutError`` / ``openai.APIConnectionError`` for a transport failure,
    ``json.JSONDecodeError`` for data that is not JSON."""
    request = response.http_request
    splitter = EventSplitter()
    pieces = response.iter_bytes().__aiter__()
    try:
        async for piece in pieces:
            received_s = time.perf_counter()
            for data in splitter.feed(piece):
                if data.startswith(DONE):
                    await _drain(response, pieces)
                    return
                chunk = json.loads(data)
                if (error := _error_event(chunk, request)) is not None:
                    raise error
                yield chunk, received_s
    except TIMEOUT_ERRORS as exc:
        raise openai.APITimeoutError(request=request) from exc
    except TRANSPORT_ERRORS as exc:
        raise openai.APIConnectionError(request=request) from exc


async def _drain(response: Any, pieces: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (HTTP/1.1 only), so that the connection is reused; give up after
    ``DRAIN_TIMEOUT_S`` or on a transport error, as the SDK does (completed output stays completed)."""
    if response.http_response.http_version != "HTTP/1.1":
        return
    with contextlib.suppress(TimeoutError, *TRANSPORT_ERRORS):
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in pieces:
                pass
