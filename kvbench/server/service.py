"""The engine behind ``kvbench serve``: requests go through the in-process backend, tokens as events.

Why this shape: the server must keep accepting connections while the engine works, so that
queueing shows up in clients' timings (as on a busy real server, a queued request's wait lands in its
TTFT). The engine runs requests in its own worker thread (:class:`kvbench.engine.protocol.Engine`:
the copy engine one at a time, first in first out; the paged engine batched) and
:class:`kvbench.backends.inprocess.InProcessBackend` awaits its future; each request becomes a
:class:`Generation`: an asyncio task awaiting ``backend.serve(request, on_token=...)``, whose tokens
travel from the engine's thread to the event loop through ``call_soon_threadsafe`` into an asyncio
queue.

On the copy engine the task is never cancelled: it waits until the engine returns, whatever the
HTTP side does. A client that disconnects (streaming or not) sets ``cancelled``; the next token
raises :class:`StreamCancelled` inside the engine, which releases every pinned block and caches
nothing of the request, and only then does the next queued request start. A request abandoned while
still queued never runs: the check when its turn comes (``on_start``) raises :class:`StreamCancelled`
before the engine starts. On a batching engine (paged; its scheduler queues) a cancel also cancels
the task, which aborts the request in the engine at its next step, waiting or running
(``Engine.abort``), so an abandoned queued request is never prefilled.
Either way the request is counted once in ``counters.num_aborted``.

Each generation's text is decoded as its tokens arrive (:class:`kvbench.server.text.TextStream`, in
the engine's thread): multi-byte characters split across tokens come out whole, and a stop sequence
ends the request there (the engine returns normally; the prompt is cached as usual).

Tokenizing runs in a worker thread (:meth:`EngineService.render` via ``asyncio.to_thread``), so a
large prompt never stalls the event loop; a prompt whose UTF-8 size alone proves it longer than the
context (``bytes / max_token_bytes > context``) is refused before it is tokenized.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from kvbench.backends.inprocess import InProcessBackend
from kvbench.engine.engine import SamplingParams
from kvbench.errors import CacheBusyError
from kvbench.request import Message, Request, RequestRecord, Status
from kvbench.server.body import OBJECT_SLACK
from kvbench.server.metrics import ServerCounters, cache_config_labels, render_metrics
from kvbench.server.schemas import MAX_N, ApiError
from kvbench.server.text import TextStream
from kvbench.workloads.tokenizer import Tokenizer

DEFAULT_UNBOUNDED_MAX_TOKENS = 4096  # a chat request's budget on a model that states no context limit
DEFAULT_UNBOUNDED_CONTEXT_TOKENS = 131_072  # bounds a body's objects on a model that states no context limit
RESET_POLL_S = 0.01  # how often a reset waiting for the paged engine to drain looks again


class StreamCancelled(Exception):
    """Raised in the engine's thread by a stream's ``on_token`` to stop a request early (its client
    went away). The engine releases every pinned block on the way out; nothing of the request is cached.
    """


class Generation:
    """One submitted request. ``events`` yields ``("token", id)`` per output token, then exactly one
    of ``("done", RequestRecord)``, ``("refused", message)`` (the engine rejected the input),
    ``("error", message)`` (the engine failed) or ``("cancelled", None)``. Each token's text (what
    may be sent with it, possibly empty) is in ``pieces`` before its event is queued (one
    ``pieces.popleft()`` per token event); after ``done``, ``text.finish()`` gives the rest."""

    def __init__(self, request: Request, sampling: SamplingParams, text: TextStream) -> None:
        self.request = request
        self.sampling = sampling
        self.text = text
        self.pieces: collections.deque[str] = collections.deque()  # appended in the engine's thread
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.task: asyncio.Task | None = None
        self.abort_task = False  # paged engine: cancel() also cancels the task (the engine aborts it)
        self.stop_reason: str | None = None  # why the server (not the client) cancelled it

    def cancel(self) -> None:
        """Stop at the next token (or, on the paged engine, at its next step, queued or running); the
        engine releases its blocks. A no-op once the request has finished. Call on the event loop."""
        self.cancelled.set()
        if self.abort_task and self.task is not None:
            self.task.cancel()


def _served(engine) -> tuple[ServerCounters, bool, int]:
    """What the server makes of ``engine``'s spec (:class:`kvbench.engine.kinds.EngineSpec`), the one
    place it is read: ``(counters, abort_in_engine, max_samples)``.

    A batching engine's own running / waiting counts are the gauges (and with a host tier, the
    ``external_`` counters are published, counted from each finished request's record), and
    a cancelled request is aborted in the engine (its scheduler queues it); otherwise the counters
    derive the gauges from the requests in flight (one runs at a time) and a cancel waits for the
    request's next token or turn. ``max_samples`` (most choices ``n`` per request) is the engine's
    limit, or the schema's :data:`~kvbench.server.schemas.MAX_N` where it has none."""
    spec = engine.spec
    counters = ServerCounters(
        engine_sequences=engine.num_sequences if spec.batching else None,
        host_tier=spec.batching and engine.host_tier_counters() is not None,
    )
    max_samples = MAX_N if spec.max_samples is None else min(spec.max_samples, MAX_N)
    return counters, spec.batching, max_samples


class EngineService:
    """Tokenizes, validates and submits requests to one :class:`InProcessBackend`.

    Args:
        backend: the engine behind it (the engine's cache, if any, is the one
            ``/reset_prefix_cache`` clears; its ``model_name`` is the one requests may ask for).
        tokenizer: renders chat messages and prompts exactly as kvbench's traces count them.

    Attributes:
        counters: the ``/metrics`` totals and gauges (:class:`ServerCounters`).
        abort_in_engine: a cancel also cancels the request's task, which aborts it in the engine.
        max_samples: most choices per request (``n``): 1 on an engine that runs one sequence per
            request, else the schema's 128.
    """

    def __init__(self, backend: InProcessBackend, tokenizer: Tokenizer) -> None:
        self.backend = backend
        self.engine = backend.engine
        self.tokenizer = tokenizer
        self.counters, self.abort_in_engine, self.max_samples = _served(self.engine)
        self._indexes = itertools.count()
        self._reset_done: asyncio.Event | None = None  # set when the pending reset (paged engine) is done
        self._live: set[Generation] = set()  # submitted, final event not yet queued

    def stop_all(self, reason: str) -> int:
        """Cancel every request in flight, queued or running, as a disconnect would (the engine
        releases their blocks), with ``reason`` as their final ``cancelled`` event's value, so each
        stream ends with one error event and ``[DONE]`` instead of running on. Used when the server
        stops. Returns how many requests (a request's ``n`` samples count once) it cancelled. Call on
        the event loop."""
        live = list(self._live)
        for generation in live:
            generation.stop_reason = reason
            generation.cancel()
        return len({id(generation.task) for generation in live})

    @property
    def model_name(self) -> str:
        return self.backend.model_name

    @property
    def max_context_tokens(self) -> int | None:
        return self.engine.loaded.max_context_tokens

    @property
    def max_body_objects(self) -> int:
        """Most JSON objects a generation body may hold (:mod:`kvbench.server.body`): the context in
        tokens (each message costs at least one) plus ``OBJECT_SLACK``."""
        return (self.max_context_tokens or DEFAULT_UNBOUNDED_CONTEXT_TOKENS) + OBJECT_SLACK

    def render_chat(self, messages: Sequence[tuple[str, str]]) -> np.ndarray:
        """``(role, text)`` pairs -> prompt ids with the generation prompt. Raises ``ApiError`` (400)."""
        if not messages:
            raise ApiError(400, "messages must not be empty", "messages")
        self._check_size(sum(len(text.encode()) for _, text in messages), "messages")
        try:
            return self.tokenizer.render_messages([Message(role, text) for role, text in messages])
        except ValueError as exc:
            raise ApiError(400, str(exc), "messages") from None

    def render_prompt(self, prompt: str | list[int]) -> np.ndarray:
        """Prompt text (rendered as the trace renders it) or token ids (taken as they are)."""
        if isinstance(prompt, str):
            self._check_size(len(prompt.encode()), "prompt")
            return self.tokenizer.render_prompt(prompt)
        return np.asarray(prompt, dtype=np.int64)

    def _check_size(self, num_bytes: int, param: str) -> None:
        """Raise ``ApiError`` (400) when ``num_bytes`` of text cannot fit the context whatever its tokens:
        every token covers at most ``tokenizer.max_token_bytes`` bytes (where the tokenizer knows it)."""
        limit, max_token_bytes = self.max_context_tokens, getattr(self.tokenizer, "max_token_bytes", None)
        if limit is None or not max_token_bytes:
            return
        min_tokens = -(-num_bytes // max_token_bytes)
        if min_tokens >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, the {param} "
                f"is {num_bytes:,} bytes, at least {min_tokens:,} tokens.",
                param,
                "context_length_exceeded",
            )

    def check(self, token_ids: np.ndarray, max_tokens: int, prompt_param: str = "prompt") -> None:
        """Raise ``ApiError`` (400) for an empty prompt, ids outside the vocabulary, a prompt plus
        ``max_tokens`` beyond the model's context, or (paged engine) beyond what its KV pool can ever
        hold (``param`` is ``prompt_param``, the field the prompt came in (``prompt``, ``messages``),
        when the prompt alone leaves no room for one output token, else ``max_tokens``)."""
        num_tokens = int(token_ids.shape[0])
        if num_tokens == 0:
            raise ApiError(400, "the prompt is empty", prompt_param)
        vocab_size = self.engine.loaded.vocab_size
        if int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size:
            raise ApiError(400, f"token id outside the model's vocabulary of {vocab_size} ids", prompt_param)
        limit = self.max_context_tokens
        if limit is not None and num_tokens + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_tokens + max_tokens} tokens ({num_tokens} in the prompt, {max_tokens} for "
                "the completion).",
                prompt_param if num_tokens >= limit else "max_tokens",
                "context_length_exceeded",
            )
        if (problem := self.engine.pool_refusal(num_tokens, max_tokens)) is not None:
            param = prompt_param if self.engine.pool_refusal(num_tokens, 1) is not None else "max_tokens"
            raise ApiError(400, problem, param)  # before a stream starts: never an error event after a 200

    def default_max_tokens(self, num_prompt_tokens: int) -> int:
        """What a chat request without ``max_tokens`` may generate: the rest of the context (OpenAI and
        vLLM generate to EOS or the limit); at least 1, so an over-long prompt gets the context error."""
        limit = self.max_context_tokens
        return max(limit - num_prompt_tokens, 1) if limit is not None else DEFAULT_UNBOUNDED_MAX_TOKENS

    def request(self, token_ids: np.ndarray, max_tokens: int, salt: str | None, request_id: str) -> Request:
        """A checked prompt (:meth:`check`) as a :class:`Request`: its own session, turn 0."""
        return Request(
            next(self._indexes),
            request_id,
            request_id,
            0,
            token_ids.astype(np.uint32),
            max_tokens=max_tokens,
            salt=salt,
        )

    def submit(self, request: Request, sampling: SamplingParams, stops: Sequence[str] = ()) -> Generation:
        """Queue ``request`` for the engine with its own ``sampling`` and stop strings; returns at
        once. Must be called on the event loop."""
        generation = Generation(request, sampling, TextStream(self.tokenizer, stops))
        generation.task = asyncio.create_task(self._run(generation))
        generation.abort_task = self.abort_in_engine
        self._live.add(generation)
        return generation

    async def _run(self, generation: Generation) -> None:
        loop = asyncio.get_running_loop()

        def on_start() -> None:  # the request's turn has come
            if generation.cancelled.is_set():
                raise StreamCancelled

        def on_token(token_id: int) -> bool:  # in the engine's thread; True ends the request (stop sequence)
            on_start()
            generation.pieces.append(generation.text.push(token_id))
            loop.call_soon_threadsafe(generation.events.put_nowait, ("token", token_id))
            return generation.text.stopped

        self.counters.num_in_flight += 1
        try:
            waited_s = await self._wait_for_reset()
            record = await self.backend.serve(
                generation.request, on_token=on_token, sampling=generation.sampling, on_start=on_start
            )
            record = replace(record, queue_ms=record.queue_ms + waited_s * 1e3)
            generation.events.put_nowait(self._finished(record))
        except (StreamCancelled, asyncio.CancelledError):  # its client left (Generation.cancel)
            self.counters.num_aborted += 1
            generation.events.put_nowait(("cancelled", generation.stop_reason))
        except Exception as exc:  # the engine failed: this request errors, the server keeps serving
            self.counters.num_failed += 1
            generation.events.put_nowait(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            self.counters.num_in_flight -= 1
            self._live.discard(generation)

    def submit_samples(
        self, request: Request, sampling: SamplingParams, n: int, stops: Sequence[str] = ()
    ) -> list[Generation]:
        """Queue ``n`` parallel samples of ``request`` (the ``n`` parameter; paged engine only): one
        :class:`Generation` per sample, in order, each with its own text and stop strings, events as
        :meth:`submit`'s. Counted as one request (its prompt looked up once, in one prefill): the
        counters get ``prompt_tokens`` and ``cached_tokens`` once and every sample's output tokens."""
        generations = [Generation(request, sampling, TextStream(self.tokenizer, stops)) for _ in range(n)]
        task = asyncio.create_task(self._run_samples(generations))
        for generation in generations:
            generation.task, generation.abort_task = task, True  # cancelling one sample aborts them all
        self._live.update(generations)
        return generations

    async def _run_samples(self, generations: list[Generation]) -> None:
        loop = asyncio.get_running_loop()

        def on_token(sample: int, token_id: int) -> bool:  # in the engine's thread
            generation = generations[sample]
            if generation.cancelled.is_set():
                raise StreamCancelled
            generation.pieces.append(generation.text.push(token_id))
            loop.call_soon_threadsafe(generation.events.put_nowait, ("token", token_id))
            return generation.text.stopped

        first = generations[0]
        self.counters.num_in_flight += 1
        try:
            await self._wait_for_reset()
            outcomes = await self.backend.serve_samples(
                first.request, first.sampling, len(generations), on_token
            )
        except asyncio.CancelledError:  # the client left: every sample was aborted
            outcomes = [asyncio.CancelledError() for _ in generations]
        finally:
            self.counters.num_in_flight -= 1
            self._live.difference_update(generations)
        records = [o for o in outcomes if isinstance(o, RequestRecord) and o.status is Status.OK]
        if records:
            self.counters.record_success(
                records[0].prompt_tokens,
                records[0].cached_prompt_tokens,
                sum(record.output_tokens for record in records),
                records[0].host_cached_tokens,
            )
        elif any(isinstance(o, RequestRecord) or not _cancelled(o) for o in outcomes):
            self.counters.num_failed += 1
        else:
            self.counters.num_aborted += 1
        for generation, outcome in zip(generations, outcomes):
            kind, value = _sample_event(outcome)
            generation.events.put_nowait((kind, generation.stop_reason if kind == "cancelled" else value))

    def _finished(self, result: RequestRecord) -> tuple[str, Any]:
        if result.status is not Status.OK:
            self.counters.num_failed += 1
            return "refused", result.error or "the engine refused the request"
        self.counters.record_success(
            result.prompt_tokens, result.cached_prompt_tokens, result.output_tokens, result.host_cached_tokens
        )
        return "done", result

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block (vLLM's endpoint) as a barrier, the same on both engines: the reset
        runs once every request submitted before it has finished (or was cancelled), and requests
        submitted meanwhile wait for it (their wait is queue time). New requests are held at
        :meth:`_wait_for_reset` while the engine drains: the copy engine's reset waits in its FIFO
        queue; the paged engine's refuses while any request is in it (``CacheBusyError``) and is
        tried again every ``RESET_POLL_S``.
        Returns ``False`` if the cache is off."""
        while self._reset_done is not None:  # one reset at a time, in order
            await self._reset_done.wait()
        self._reset_done = done = asyncio.Event()
        try:
            while True:
                try:
                    return await self.backend.reset_prefix_cache()
                except CacheBusyError:  # requests submitted before the reset still run
                    await asyncio.sleep(RESET_POLL_S)
        finally:
            self._reset_done = None
            done.set()

    async def _wait_for_reset(self) -> float:
        """Wait while a reset drains the engine; the seconds waited."""
        start_s = time.perf_counter()
        while self._reset_done is not None:
            await self._reset_done.wait()
        return time.perf_counter() - start_s

    def metrics_text(self) -> str:
        cache = self.engine.cache_config
        labels = cache_config_labels(
            *((cache.block_size, cache.capacity_blocks) if cache is not None else (None, None))
        )
        return render_metrics(self.counters, self.model_name, labels)


def _cancelled(outcome: BaseException) -> bool:
    return isinstance(outcome, (StreamCancelled, asyncio.CancelledError))


def _sample_event(outcome: RequestRecord | BaseException) -> tuple[str, Any]:
    """One sample's final event (:class:`Generation`)."""
    if isinstance(outcome, RequestRecord):
        if outcome.status is Status.OK:
            return "done", outcome
        return "refused", outcome.error or "the engine refused the request"
    if _cancelled(outcome):
        return "cancelled", None
    return "error", f"{type(outcome).__name__}: {outcome}"
