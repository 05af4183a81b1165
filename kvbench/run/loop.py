"""The one send loop: warm-up, closed and open loop, sessions in order, a duration, an injected clock.

Every way kvbench sends requests goes through :func:`send_requests`: ``kvbench run`` on the
in-process engine or an HTTP server, ``kvbench sweep``, the break experiments and the peer harness.
It decides *when* each request is sent; the backend (:mod:`kvbench.backends.base`) serves it.

* **Closed loop** (``concurrency`` c, vLLM bench's ``--max-concurrency`` with an infinite rate): c
  clients take requests in trace order; each sends its next request as soon as its previous one
  finished.
* **Open loop** (``request_rate_per_s`` R, ``burstiness`` k): request i is due at the i-th point of a
  renewal process whose gaps are gamma(shape=k, scale=1/(R k)): mean 1/R, k = 1 is Poisson, k < 1
  burstier (vLLM ``bench serve``'s ``--request-rate`` / ``--burstiness``). The first request is due
  at 0. With ``concurrency`` set, at most that many are in flight.
* **Trace replay** (``time_scale`` X, ``kvbench run --schedule trace``): request i is due at its own
  ``arrival_s`` minus the first measured request's, divided by X (X = 10 replays ten times faster,
  0.5 at half speed); otherwise as the open loop. A session's turn still waits for the previous turn
  to finish, so the trace's think time is kept whenever the server keeps up, and a late turn goes
  right after its predecessor (its lag, ``sent - due``, says by how much).
* **Session order**: a session's turn k+1 is sent only after turn k finished (its prompt carries
  turn k's reply), even when it is due earlier or another client is free.
* **Queue time** (``queue_ms``, never inside TTFT): from the request being taken by a client (closed
  loop) or due (open loop) to the backend starting to serve it: waiting for the session's previous
  turn, for a concurrency slot, and the backend's own wait (the in-process engine serves one request
  at a time) that it reports in its record. A remote server's own queue is inside its TTFT, as it
  is for any client.
* **Warm-up**: the first ``num_warmup`` requests run first, closed loop, marked ``warmup``.
* ``duration_s`` stops *sending* that long after the measured phase began; in-flight requests
  finish, unsent ones leave no record.
* ``max_connection_failures`` n: after n consecutive records that are connection failures
  (:attr:`RequestRecord.is_connection_failure`: the server is gone), nothing more is sent; every
  request left gets an error record "not sent: ..." at once, so a dead server costs n requests, not
  the whole trace of timeouts and refusals.

``on_record(request, record)`` sees each record as soon as it exists, so an interrupted run (Ctrl-C,
an exception) keeps every finished request.

``turns`` (:class:`Turns`, e.g. :class:`kvbench.run.live_turns.LiveTurns` for ``--turns live``) builds
each request at send time: ``prepare(request)`` runs once the request's previous turn finished and
its concurrency slot is free (its time counts as queue time), and the request it returns is what is
sent; ``finished(request, record)`` sees the record before the session's next turn wakes and returns
the request to record (with what it learnt, e.g. its expected cached tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from kvbench.backends.base import Backend
from kvbench.request import NOT_SENT, Phase, Request, RequestRecord
from kvbench.run.clock import WALL_CLOCK, Clock

OnRecord = Callable[[Request, RequestRecord], None]


class Turns(Protocol):
    """Builds requests at send time from what earlier ones returned (module docstring)."""

    def prepare(self, request: Request) -> Request: ...

    def finished(self, request: Request, record: RequestRecord) -> Request: ...


@dataclass(frozen=True)
class LoadConfig:
    """How requests are sent (see the module docstring). Raises ``ValueError`` when invalid.

    Attributes:
        concurrency: most requests in flight; ``None`` (open loop only) = no cap.
        request_rate_per_s: mean arrival rate; ``math.inf`` = closed loop.
        burstiness: gamma shape of the arrival gaps (1 = Poisson).
        duration_s: stop sending after this many seconds of the measured phase; ``None`` = all.
        num_warmup: requests sent first as a marked warm-up.
        seed: seeds the arrival gaps.
        time_scale: replay the trace's own arrival times sped up by this factor (``None``: use the
            rate); an open loop that ignores ``request_rate_per_s``.
    """

    concurrency: int | None = 1  # 1 = exact: no request ever waits for another
    request_rate_per_s: float = math.inf
    burstiness: float = 1.0
    duration_s: float | None = None
    num_warmup: int = 0
    seed: int = 0
    time_scale: float | None = None
    max_connection_failures: int | None = None  # None: keep sending whatever happens

    def __post_init__(self) -> None:
        if self.time_scale is not None and not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ValueError(f"--time-scale: {self.time_scale} must be a positive number")
        if self.time_scale is not None and math.isfinite(self.request_rate_per_s):
            raise ValueError("--schedule trace replays the trace's own times: drop --request-rate")
        if self.concurrency is None and not self.is_open_loop:
            raise ValueError("a closed loop needs a concurrency (or give a request rate)")
        if self.concurrency is not None and not _is_int_at_least(self.concurrency, 1):
            raise ValueError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if not _is_int_at_least(self.num_warmup, 0):
            raise ValueError(f"warmup must be a non-negative integer, got {self.num_warmup!r}")
        if not self.request_rate_per_s > 0:
            raise ValueError(
                f"request rate must be positive (inf = closed loop), got {self.request_rate_per_s}"
            )
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be a positive number, got {self.burstiness}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration must be positive, got {self.duration_s}")
        if self.max_connection_failures is not None and not _is_int_at_least(self.max_connection_failures, 1):
            raise ValueError(
                f"max_connection_failures must be a positive integer, got {self.max_connection_failures!r}"
            )

    @property
    def is_open_loop(self) -> bool:
        return math.isfinite(self.request_rate_per_s) or self.time_scale is not None

    def due_offsets_s(self, batch: Sequence[Request]) -> np.ndarray:
        """Due times of an open-loop batch, s from its start, shape (len(batch),): the trace's own
        times scaled (``time_scale``) or the rate's arrival process."""
        if self.time_scale is None:
            return arrival_offsets_s(len(batch), self.request_rate_per_s, self.burstiness, self.seed)
        arrivals = np.array([request.arrival_s for request in batch], dtype=np.float64)
        return (arrivals - arrivals.min()) / self.time_scale if len(batch) else arrivals


def _is_int_at_least(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def arrival_offsets_s(num_requests: int, rate_per_s: float, burstiness: float, seed: int) -> np.ndarray:
    """Due times (s from the phase start), shape (num_requests,): 0, then cumulative gamma gaps of
    shape ``burstiness`` and mean ``1 / rate_per_s`` (vLLM bench's arrival process)."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate_per_s * burstiness), size=max(num_requests - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])[:num_requests]


class _Run:
    """State of one :func:`send_requests` call: which turn waits for which, and the records."""

    def __init__(
        self,
        requests: Sequence[Request],
        backend: Backend,
        on_record: OnRecord | None,
        clock: Clock,
        max_connection_failures: int | None = None,
        turns: Turns | None = None,
    ) -> None:
        self.backend, self.on_record, self.clock, self.turns = backend, on_record, clock, turns
        self.max_connection_failures = max_connection_failures
        self.num_connection_failures = 0  # consecutive
        self.gave_up: str | None = None  # why nothing more is sent
        self.stopped = asyncio.Event()  # set with gave_up: open-loop requests stop waiting for their due time
        self.start_s = clock.now()
        self.done = {request.index: asyncio.Event() for request in requests}
        self.previous: dict[int, int] = {}
        last_of_session: dict[str, int] = {}
        for request in requests:
            if request.session_id in last_of_session:
                self.previous[request.index] = last_of_session[request.session_id]
            last_of_session[request.session_id] = request.index
        self.records: list[tuple[Request, RequestRecord]] = []

    async def previous_turn(self, request: Request) -> None:
        if (previous := self.previous.get(request.index)) is not None:
            await self.done[previous].wait()

    def skip(self, request: Request) -> None:
        self.done[request.index].set()  # unsent: later turns of its session are past the deadline too

    async def serve(self, request: Request, phase: Phase, queued_since_s: float) -> None:
        index = request.index
        try:
            if self.gave_up is not None:
                return self._keep(
                    request, replace(RequestRecord.failed(request.prompt_tokens, self.gave_up), phase=phase)
                )
            if self.turns is not None:
                request = self.turns.prepare(request)
            sent_s = self.clock.now()
            record = await self.backend.serve(request)
            ended_s = self.clock.now()
            record = replace(
                record,
                phase=phase,
                queue_ms=(sent_s - queued_since_s) * 1e3 + record.queue_ms,
                sent_s=sent_s - self.start_s,
                ended_s=ended_s - self.start_s,
                due_s=queued_since_s - self.start_s,
            )
            if self.turns is not None:
                request = self.turns.finished(request, record)
            self._count_failure(record)
            self._keep(request, record)
        finally:
            self.done[index].set()
        task = asyncio.current_task()
        if task is not None and task.cancelling():  # cancelled, and the backend handed the row back
            raise asyncio.CancelledError  # (a finished request whose --verify check was pending): stop here
        await asyncio.sleep(0)  # let a session's next turn, woken just now, go before a later request

    def _keep(self, request: Request, record: RequestRecord) -> None:
        self.records.append((request, record))
        if self.on_record is not None:
            self.on_record(request, record)

    def _count_failure(self, record: RequestRecord) -> None:
        self.num_connection_failures = self.num_connection_failures + 1 if record.is_connection_failure else 0
        limit = self.max_connection_failures
        if limit is not None and self.num_connection_failures >= limit and self.gave_up is None:
            self.gave_up = (
                f"{NOT_SENT}: the send loop stopped after {limit} consecutive connection failures "
                f"(last: {record.error})"
            )
            self.stopped.set()

    async def sleep_unless_stopped(self, seconds: float) -> None:
        """``clock.sleep(seconds)``, cut short when the run gives up."""
        sleep = asyncio.ensure_future(self.clock.sleep(seconds))
        stop = asyncio.ensure_future(self.stopped.wait())
        await asyncio.wait({sleep, stop}, return_when=asyncio.FIRST_COMPLETED)
        for task in (sleep, stop):
            task.cancel()


async def _closed_loop(
    run: _Run, batch: Sequence[Request], phase: Phase, concurrency: int, deadline_s: float
) -> None:
    pending = iter(batch)  # shared by the clients: each takes the next request in trace order

    async def client() -> None:
        for request in pending:
            taken_s = run.clock.now()
            if taken_s > deadline_s:
                run.skip(request)
                continue
            await run.previous_turn(request)
            await run.serve(request, phase, taken_s)

    await asyncio.gather(*(client() for _ in range(min(concurrency, len(batch)))))


async def _open_loop(
    run: _Run, batch: Sequence[Request], phase: Phase, load: LoadConfig, deadline_s: float
) -> None:
    phase_start_s = run.clock.now()
    due_s = phase_start_s + load.due_offsets_s(batch)
    slots = asyncio.Semaphore(load.concurrency) if load.concurrency else None

    async def one(request: Request, request_due_s: float) -> None:
        if request_due_s > deadline_s:
            run.skip(request)
            return
        await run.sleep_unless_stopped(request_due_s - run.clock.now())
        await run.previous_turn(request)
        async with slots or contextlib.nullcontext():
            await run.serve(request, phase, request_due_s)

    await asyncio.gather(*(one(request, float(due)) for request, due in zip(batch, due_s)))


async def send_requests(
    requests: Sequence[Request],
    backend: Backend,
    load: LoadConfig = LoadConfig(),
    on_record: OnRecord | None = None,
    clock: Clock = WALL_CLOCK,
    turns: Turns | None = None,
    on_start: Callable[[float], None] | None = None,
) -> list[tuple[Request, RequestRecord]]:
    """Send ``requests`` (``load.num_warmup`` first, as warm-up) through ``backend``.

    Returns every ``(request, record)`` in the order they finished (the request as ``turns`` built
    it, where given); each record carries its phase, queue time and service window. Cancellation
    (Ctrl-C) propagates after ``on_record`` has seen every finished request. ``on_start(start_s)``:
    told the loop's start on ``clock``, from which the records' times count.
    """
    run = _Run(requests, backend, on_record, clock, load.max_connection_failures, turns)
    if on_start is not None:
        on_start(run.start_s)
    num_warmup = min(load.num_warmup, len(requests))
    warmup, measured = requests[:num_warmup], requests[num_warmup:]
    if warmup:
        await _closed_loop(run, warmup, Phase.WARMUP, load.concurrency or 1, math.inf)
    deadline_s = clock.now() + load.duration_s if load.duration_s is not None else math.inf
    if load.is_open_loop:
        await _open_loop(run, measured, Phase.MEASURE, load, deadline_s)
    else:
        await _closed_loop(run, measured, Phase.MEASURE, load.concurrency, deadline_s)
    return run.records


def run_requests(
    requests: Sequence[Request],
    backend: Backend,
    load: LoadConfig = LoadConfig(),
    on_record: OnRecord | None = None,
) -> list[tuple[Request, RequestRecord]]:
    """:func:`send_requests` on the wall clock from synchronous code (its own event loop)."""
    return asyncio.run(send_requests(requests, backend, load, on_record))
