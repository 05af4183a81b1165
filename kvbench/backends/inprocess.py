"""The in-process backend: the transformers engine with the pluggable prefix cache, in this process.

The engine computes one request at a time, so :meth:`InProcessBackend.serve` takes an
``asyncio.Lock`` and runs the engine in a worker thread (``asyncio.to_thread``): the event loop
stays free for the send loop's clients and for ``kvbench serve``'s HTTP connections. The time a
request waits for the lock is its queue time (``RequestRecord.queue_ms``), never part of its TTFT.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvbench.engine.engine import HFEngine
from kvbench.engine.paged.engine import PagedEngine
from kvbench.engine.sampling import SamplingParams
from kvbench.request import Request, RequestRecord


class InProcessBackend:
    """Serves requests on an :class:`HFEngine`, one at a time, in a worker thread.

    ``sampling`` gives temperature / top-p / seed / ignore_eos; each request's own ``max_tokens``
    replaces its budget.
    """

    def __init__(self, engine: HFEngine | PagedEngine, sampling: SamplingParams, model_name: str) -> None:
        self.engine = engine
        self.sampling = sampling
        self.model_name = model_name
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    def describe(self) -> dict[str, Any]:
        cache = self.engine.config.cache
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

    async def serve(self, request: Request, on_token: Callable[[int], bool | None] | None = None,
                    sampling: SamplingParams | None = None,
                    on_start: Callable[[], None] | None = None) -> RequestRecord:
        """Run ``request`` on the engine; ``on_token(token_id)`` is called from the worker thread
        with every output token as soon as it is sampled (``kvbench serve`` streams them; see
        :meth:`HFEngine.generate` for what its return value and exceptions do).
        ``sampling``: this request's own (``kvbench serve``'s per-request body); ``None`` = the
        backend's with the request's ``max_tokens``. ``on_start()`` is called once the request's turn
        has come, before the engine starts; an exception it raises propagates and nothing runs (a
        request whose client left while it was queued)."""
        if isinstance(self.engine, PagedEngine):
            if on_start is not None:
                on_start()  # the scheduler queues: a client that left is caught by the cancel below
            return await self._serve_batched(request, on_token, sampling)
        queued_s = time.perf_counter()
        async with self._lock():
            waited_ms = (time.perf_counter() - queued_s) * 1e3
            if on_start is not None:
                on_start()
            record = await asyncio.to_thread(self.engine.generate, request.token_ids,
                                             sampling or self.sampling_for(request), salt=request.salt,
                                             on_token=on_token)
        return replace(record, queue_ms=waited_ms)

    async def _serve_batched(self, request: Request, on_token: Callable[[int], bool | None] | None,
                             sampling: SamplingParams | None) -> RequestRecord:
        future = self.engine.submit(request.token_ids, sampling or self.sampling_for(request), salt=request.salt,
                                    on_token=on_token)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if (measured := self.engine.abort(future)) is not None:
                return measured  # finished, only its --verify check was pending: keep the row (Ctrl-C)
            raise

    async def serve_samples(self, request: Request, sampling: SamplingParams, n: int,
                            on_token: Callable[[int, int], bool | None] | None = None) -> list[RequestRecord | BaseException]:
        """Run ``n`` parallel samples of ``request`` on the paged engine (one prefill, the prompt's
        blocks shared: :meth:`PagedEngine.submit_samples`); ``on_token(sample, token_id)`` from the
        engine's thread. Returns each sample's record, or the exception that ended it
        (``CancelledError`` when aborted), in sample order; cancelling the caller aborts every sample.

        Raises:
            ValueError: the engine is the copy engine (it runs one sequence per request).
        """
        if not isinstance(self.engine, PagedEngine):
            raise ValueError("n > 1 needs --engine paged (the copy engine runs one sequence per request)")
        futures = self.engine.submit_samples(request.token_ids, sampling, n, salt=request.salt, on_token=on_token)
        try:
            return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        except asyncio.CancelledError:
            for future in futures:
                self.engine.abort(future)
            raise

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block (vLLM's endpoint). ``False`` if the cache is off. The copy engine's
        reset takes the FIFO lock: it runs after every request queued before it, and requests queued
        after it wait for it. The paged engine's refuses at once while any request is in it.

        Raises:
            CacheBusyError: paged engine only, a request is in the engine (running or waiting).
        """
        if isinstance(self.engine, PagedEngine):
            if self.engine.config.cache is None:
                return False
            self.engine.reset_prefix_cache()
            return True
        async with self._lock():
            if self.engine.cache is None:
                return False
            self.engine.cache.reset()
            return True

    def _lock(self) -> asyncio.Lock:
        """One lock per event loop (a lock is bound to the loop it is first used on)."""
        loop = asyncio.get_running_loop()
        if loop not in self._locks:
            self._locks = {loop: asyncio.Lock()}  # an earlier loop has finished: its lock is no use
        return self._locks[loop]
