"""The one backend contract: ``async serve(request) -> RequestRecord``.

Every backend (the in-process engine, an OpenAI-compatible server over HTTP) implements it; the send
loop (:mod:`kvbench.run.loop`), ``kvbench serve`` and the peer harness all call it. ``serve`` never
raises for a failed request: the failure is a record with status ``error`` and one line of text. It
may raise for a broken backend (a bug, a lost model), which stops the run after the rows so far.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvbench.request import Request, RequestRecord


class Backend(Protocol):
    """Serves requests; ``describe()`` gives the result columns the backend fixes for every row
    (``backend``, ``model``, ``cache_enabled``, ``cache_kind``, ``block_size``, ``capacity_blocks``)."""

    async def serve(self, request: Request) -> RequestRecord: ...

    def describe(self) -> dict[str, Any]: ...
