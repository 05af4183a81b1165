"""The in-process backend: an in-process engine (:class:`kvbench.engine.protocol.Engine`), in this process.

The engine runs requests in its own worker thread (the copy engine one at a time, first in first
out; the paged engine batched), so :meth:`InProcessBackend.serve` only submits and awaits the
engine's future: the event loop stays free for the send loop's clients and for ``kvbench serve``'s
HTTP connections. The wait from submit to start is the record's queue time
(``RequestRecord.queue_ms``), never part of its TTFT. One path for every engine: the backend never
asks which engine it holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvbench.engine.protocol import Engine
from kvbench.engine.sampling import SamplingParams
from kvbench.request import Request, RequestRecord


class InProcessBackend:
    """Serves requests on an in-process engine (built by :func:`kvbench.run.engines.build_backend`).

    ``sampling`` gives temperature / top-p / seed / ignore_eos; each request's own ``max_tokens``
    replaces its budget.
    """

    def __init__(self, engine: Engine, sampling: SamplingParams, model_name: str) -> None:
        self.engine = engine
        self.sampling = sampling
        self.model_name = model_name

    def describe(self) -> dict[str, Any]:
        cache = self.engine.cache_config
        return {
            "backend": "inprocess",
            "model": self.model_name,
            "cache_enabled": cache is not None,
            "cache_kind": cache.kind.value if cache else None,
            "block_size": cache.block_size if cache else None,
            "capacity_blocks": cache.capacity_blocks if cache else None,
        }

    def sampling_for(self, request: Request) -> SamplingParams:
        """The run's sampling with the request's own output budget."""
        return replace(self.sampling, max_tokens=request.max_tokens)

    async def serve(
        self,
        request: Request,
        on_token: Callable[[int], bool | None] | None = None,
        sampling: SamplingParams | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> RequestRecord:
        """Run ``request`` on the engine; ``on_token(token_id)`` is called from the worker thread
        with every output token as soon as it is sampled (``kvbench serve`` streams them; see
        :meth:`kvbench.engine.protocol.Engine.submit` for what its return value and exceptions do).
        ``sampling``: this request's own (``kvbench serve``'s per-request body); ``None`` = the
        backend's with the request's ``max_tokens``. ``on_start()`` is called once before the request
        can run (the engine's ``submit``); an exception it raises propagates and nothing runs (a
        request whose client left while it was queued). Cancelling the caller aborts the request in
        the engine (queued: it never runs; running: it stops at its next token or step)."""
        future = self.engine.submit(
            request.token_ids,
            sampling or self.sampling_for(request),
            salt=request.salt,
            on_token=on_token,
            on_start=on_start,
        )
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if (measured := self.engine.abort(future)) is not None:
                return measured  # finished, only its --verify check was pending: keep the row (Ctrl-C)
            raise

    async def serve_samples(
        self,
        request: Request,
        sampling: SamplingParams,
        n: int,
        on_token: Callable[[int, int], bool | None] | None = None,
    ) -> list[RequestRecord | BaseException]:
        """Run ``n`` parallel samples of ``request`` on the paged engine (one prefill, the prompt's
        blocks shared: :meth:`PagedEngine.submit_samples`); ``on_token(sample, token_id)`` from the
        engine's thread. Returns each sample's record, or the exception that ended it
        (``CancelledError`` when aborted), in sample order; cancelling the caller aborts every sample.

        Raises:
            ValueError: the engine is the copy engine (it runs one sequence per request).
        """
        futures = self.engine.submit_samples(
            request.token_ids, sampling, n, salt=request.salt, on_token=on_token
        )
        try:
            return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        except asyncio.CancelledError:
            for future in futures:
                self.engine.abort(future)
            raise

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block (vLLM's endpoint), in a worker thread. ``False`` if the cache is off.
        The copy engine's reset waits in its FIFO: it runs after every request queued before it, and
        requests queued after it wait for it. The paged engine's refuses at once while any request is
        in it.

        Raises:
            CacheBusyError: paged engine only, a request is in the engine (running or waiting).
        """
        return await asyncio.to_thread(self.engine.reset_prefix_cache)
