"""Waiting for a non-streamed request's result while watching its client (every generation route).

One mechanism for ``/v1/completions``, ``/v1/chat/completions`` (``n`` choices too) and
``/v1/messages``: :func:`outcomes_unless_gone` waits for the engine's result and for the client's
``http.disconnect`` at once. A client that leaves first (a client timeout, ``curl -m``, a closed
socket) cancels every generation of the request, queued or running: the engine frees its blocks and
caches nothing of it, the request is counted in ``kvbench:request_abort_total``, and the route
answers 499 (nginx's "client closed request"; nobody reads it).
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from kvbench.request import RequestRecord
from kvbench.server.schemas import ApiError
from kvbench.server.service import Generation

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client left before the answer


async def outcome(generation: Generation) -> RequestRecord:
    """Wait for the request's result (token events are skipped). Raises ``ApiError``: 400 if the
    engine refused it, 500 if it failed or was cancelled."""
    while True:
        kind, value = await generation.events.get()
        if kind == "done":
            return value
        if kind in ("refused", "error", "cancelled"):
            raise ApiError(400 if kind == "refused" else 500, str(value or "the request was cancelled"))


async def outcomes_unless_gone(http: Request, generations: list[Generation]) -> list[RequestRecord] | None:
    """Every generation's result (:func:`outcome`, in order), or ``None`` when the client disconnects
    first (every generation then cancelled). Raises ``ApiError`` as :func:`outcome` does."""
    results = asyncio.ensure_future(asyncio.gather(*(outcome(generation) for generation in generations)))
    gone = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait({results, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not results.done():  # the client left (or this handler was cancelled): stop the engine's work
            for generation in generations:
                generation.cancel()
            results.cancel()  # done only once its waiters have seen the cancellation: never read it here
            results.add_done_callback(_retrieve)
    return results.result() if results.done() else None


def _retrieve(future: asyncio.Future) -> None:
    """Mark a cancelled gather's outcome as read (else asyncio logs "exception was never retrieved")."""
    if not future.cancelled():
        future.exception()


async def _disconnected(http: Request) -> None:
    """Returns when the client has gone (the body was read already, so ``receive`` waits for that)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass
