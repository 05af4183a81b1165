"""The copy engine's queue: requests run one at a time, first in first out, on one worker thread.

:meth:`SerialQueue.submit` queues a request and returns a :class:`~kvbench.engine.worker.RequestFuture`
at once (any thread); the worker thread (:class:`~kvbench.engine.worker.Worker`) runs the queued
requests in submission order, each through the engine's synchronous ``generate``. The rules are those
of the asyncio lock the in-process backend held before (a busy server's queue):

* ``queue_ms`` of a record is the wait from ``submit`` until its request started;
* ``on_start()`` runs in the worker thread when the request's turn has come, before the engine
  starts; an exception it raises becomes the future's and nothing runs (a client that left while its
  request was queued);
* :meth:`SerialQueue.abort` cancels a queued request (it never runs) or stops a running one at its
  next token (every pinned block released, nothing of it cached; the future is cancelled); at
  interpreter exit the running request stops at its next token too (:mod:`kvbench.engine.worker`);
* :meth:`SerialQueue.after_queued` runs a call (the prefix-cache reset) once every request queued
  before it has finished; requests queued after it wait for it.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from kvbench.engine.sampling import SamplingParams
from kvbench.engine.worker import WAIT_IDLE_S, RequestFuture, Task, Worker
from kvbench.request import Request, RequestRecord, Status

T = TypeVar("T")

# (token_ids, sampling, salt, on_token=) -> record: one request, synchronous
Generate = Callable[..., RequestRecord]


class _Aborted(Exception):
    """Raised in the worker thread by a running request's token callback once its future was cancelled."""


@dataclass
class _Queued:
    """One queued request: the engine's arguments, the caller's callbacks and its future."""

    future: RequestFuture
    generate: Generate  # the engine's: held only while the request is queued or running
    args: tuple[Any, ...]  # (token_ids, sampling, salt)
    on_token: Callable[[int], bool | None] | None
    on_start: Callable[[], None] | None
    submitted_s: float  # time.perf_counter()


class SerialQueue:
    """FIFO requests over one synchronous ``generate`` (module docstring)."""

    def __init__(self, name: str = "kvbench-copy") -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[_Queued | Task] = collections.deque()
        self._worker = Worker(self._lock, self._next_task, name)
        self._seq_ids = itertools.count()
        self._num_running = 0

    def submit(
        self,
        generate: Generate,
        args: tuple[Any, ...],
        on_token: Callable[[int], bool | None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> RequestFuture:
        """Queue ``generate(*args, on_token=...)``; the future gets its record (``queue_ms`` set) or
        the exception it, ``on_token`` or ``on_start`` raised; cancelled when aborted."""
        future = RequestFuture()
        future.seq_id = next(self._seq_ids)
        with self._lock:
            self._queue.append(_Queued(future, generate, args, on_token, on_start, time.perf_counter()))
            self._worker.wake()
        return future

    def abort(self, future: RequestFuture) -> None:
        """Cancel ``future``'s request: a queued one never runs, a running one stops at its next token."""
        with self._lock:
            future.cancel()  # never set running: a pending future can always be cancelled

    def after_queued(self, call: Callable[[], T]) -> T:
        """Run ``call()`` in the worker thread once every request queued before it has finished; wait
        for it and return its result (its exception propagates). Never call from the worker thread."""
        done: Future = Future()

        def task() -> None:
            try:
                done.set_result(call())
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                done.set_exception(error)

        with self._lock:
            self._queue.append(task)
            self._worker.wake()
        return done.result()

    def num_requests(self) -> tuple[int, int]:
        """``(running, waiting)`` requests now."""
        with self._lock:
            return self._num_running, sum(isinstance(item, _Queued) for item in self._queue)

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """Block until the queue is empty and its worker thread has ended."""
        self._worker.join(timeout_s)

    def _next_task(self) -> Task | None:  # lock held
        if not self._queue:
            return None
        item = self._queue.popleft()
        if not isinstance(item, _Queued):
            return item
        self._num_running += 1
        return lambda: self._run(item)

    def _run(self, item: _Queued) -> None:
        """One request in the worker thread; its outcome goes to its future."""
        started_s = time.perf_counter()
        outcome: RequestRecord | BaseException | None = None
        try:
            if not item.future.cancelled():
                if item.on_start is not None:
                    item.on_start()
                record = item.generate(*item.args, on_token=lambda token_id: self._on_token(item, token_id))
                outcome = replace(record, queue_ms=(started_s - item.submitted_s) * 1e3)
        except _Aborted:
            pass  # the future is cancelled already
        except BaseException as error:  # noqa: BLE001 - the caller's callbacks stop their own request only
            outcome = error
        with self._lock:
            self._num_running -= 1
            if outcome is not None and not item.future.done():
                if isinstance(outcome, BaseException):
                    item.future.set_exception(outcome)
                else:
                    item.future.set_result(outcome)

    def _on_token(self, item: _Queued, token_id: int) -> bool | None:
        if item.future.cancelled() or self._worker.stopping:  # aborted, or the interpreter is exiting
            raise _Aborted
        return item.on_token(token_id) if item.on_token is not None else None


class SerialCalls:
    """The :class:`kvbench.engine.protocol.Engine` calls of an engine that runs one request at a time
    through its synchronous ``generate`` (the copy engine): a :class:`SerialQueue` over it. The class
    it is mixed into has ``loaded``, ``cache`` (a prefix cache or ``None``), ``run_request`` (one
    request, synchronous) and ``held_kv_bytes()``."""

    def __init__(self) -> None:
        self._queue = SerialQueue()

    def submit(
        self,
        token_ids,
        sampling: SamplingParams = SamplingParams(),
        salt: str | None = None,
        on_token: Callable[[int], bool | None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> RequestFuture:
        """Queue one request behind those submitted before it (:class:`SerialQueue`, the protocol's
        contract)."""
        return self._queue.submit(self.run_request, (token_ids, sampling, salt), on_token, on_start)

    def generate(
        self,
        token_ids,
        sampling: SamplingParams = SamplingParams(),
        salt: str | None = None,
        on_token: Callable[[int], bool | None] | None = None,
        extra_keys: Sequence[str | bytes | int] = (),
    ) -> RequestRecord:
        """Run one request behind those queued before it and wait for it; ``on_token``'s errors
        propagate. ``extra_keys`` (copy engine only): more block-key inputs (an adapter id, image hashes)."""
        args = (token_ids, sampling, salt, tuple(extra_keys))
        return self._queue.submit(self.run_request, args, on_token).result()

    def submit_samples(
        self,
        token_ids,
        sampling: SamplingParams,
        n: int,
        salt: str | None = None,
        on_token: Callable[[int, int], bool | None] | None = None,
    ) -> list[RequestFuture]:
        """Raises ``ValueError``: this engine runs one sequence per request."""
        raise ValueError("n > 1 needs --engine paged (the copy engine runs one sequence per request)")

    def abort(self, future: RequestFuture) -> RequestRecord | None:
        """Cancel a queued request or stop a running one at its next token; ``None`` (verify runs inline)."""
        self._queue.abort(future)
        return None

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block once every request queued before has finished; ``False`` if the cache is
        off."""
        if self.cache is None:
            return False
        return self._queue.after_queued(self._reset_cache)

    def _reset_cache(self) -> bool:
        self.cache.reset()
        return True

    def pool_refusal(self, num_prompt_tokens: int, max_tokens: int) -> str | None:
        return None  # blocks are allocated per request: no pool to outgrow

    def num_sequences(self) -> tuple[int, int]:
        return self._queue.num_requests()

    def host_tier_counters(self) -> tuple[int, int] | None:
        return None

    @property
    def verify_report(self) -> None:
        return None  # --verify compares tokens exactly: no tolerance to report

    def wait_idle(self, timeout_s: float | None = None) -> None:
        self._queue.wait_idle(timeout_s)

    def describe(self) -> dict[str, Any]:
        return {"kind": "copy"}

    def memory(self, records: Sequence[tuple[Request, RequestRecord]]) -> dict[str, int | str]:
        """``run.kv_memory``: the block tensors the cache keeps alive at the end (measured,
        ``held_kv_bytes``: distinct storages) and the largest request's contiguous copy (computed:
        prompt + output - 1 tokens x KV bytes per token; one request runs at a time), bytes."""
        self.wait_idle(WAIT_IDLE_S)
        per_token = self.loaded.kv_layout().bytes_per_token
        tokens = [
            r.prompt_tokens + r.output_tokens - 1
            for _, r in records
            if r.status is Status.OK and r.output_tokens
        ]
        contiguous = max(tokens, default=0) * per_token
        held = self.held_kv_bytes()
        return {
            "engine": "copy",
            "end_held_kv_bytes": held,
            "peak_contiguous_kv_bytes": contiguous,
            "peak_copy_engine_kv_bytes": held + contiguous,
        }
