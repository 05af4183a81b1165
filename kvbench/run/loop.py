"""Runs a trace against a backend: request order, phases, closed-loop concurrency, result rows.

The runner knows nothing about models or HTTP: a backend is anything with
``serve(request) -> ServedRequest``. It decides *when* each request is served and records it:

* Order: trace order. A session's turn k+1 is never sent before turn k has finished (a chat client
  needs the reply first), even with several clients.
* Concurrency ``c`` (closed loop, vLLM's ``--max-concurrency``): ``c`` clients each send their next
  request as soon as their previous one finished. The in-process engine serves one request at a
  time, oldest send first, so with ``c > 1`` requests wait: that wait is ``queue_ms``, recorded
  apart from TTFT, never inside it. With ``c = 1`` the queue is empty and every number is exact.
* Phases: the first ``warmup`` requests are served first and marked ``warmup`` (kept, not summarized).

Rows follow :mod:`kvbench.results.schema`; ``on_row`` sees each row as soon as it exists, so an
interrupted run keeps every finished request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kvbench.results.schema import empty_row


@dataclass(frozen=True, eq=False)
class RunRequest:
    """One request as the runner sends it.

    Attributes:
        index: position in the trace.
        request_id, session_id, turn: identity; ``turn`` is the chat turn or agent step (0-based).
        arrival_ms: the trace's arrival offset (kept in the results; closed-loop runs do not wait).
        token_ids: the rendered prompt, shape (num_tokens,), uint32.
        max_tokens: output budget.
        salt: tenant salt from the trace, or ``None`` for the run's.
        text: the trace request (messages or prompt) for backends that send text, else ``None``.
        expected_cached_tokens: what the simulator predicts for this request, if computed.
    """

    index: int
    request_id: str
    session_id: str
    turn: int
    arrival_ms: float
    token_ids: np.ndarray
    max_tokens: int
    salt: str | None = None
    text: Any = None
    expected_cached_tokens: int | None = None

    @property
    def prompt_tokens(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class ServedRequest:
    """What a backend reports for one request. Times are ms from the start of service."""

    status: str  # "ok" or "error"
    prompt_tokens: int
    cached_prompt_tokens: int | None = None
    output_tokens: int = 0
    output_tokens_source: str = "engine"
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    e2e_ms: float | None = None
    prefill_ms: float | None = None
    error: str | None = None
    http_status: int | None = None
    output_matches_reference: bool | None = None


class Backend(Protocol):
    """Serves one request at a time. ``describe()`` gives the result columns it fixes."""

    def serve(self, request: RunRequest) -> ServedRequest: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RunPlan:
    """How to run: concurrency (closed-loop clients), warm-up count and the run id. Validated."""

    run_id: str
    concurrency: int = 1  # 1 = exact: no request ever waits
    num_warmup: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if not isinstance(self.num_warmup, int) or self.num_warmup < 0:
            raise ValueError(f"warmup must be a non-negative integer, got {self.num_warmup!r}")


def result_row(plan: RunPlan, columns: dict[str, Any], request: RunRequest, served: ServedRequest,
               phase: str, queue_ms: float) -> dict[str, Any]:
    """One results row (:mod:`kvbench.results.schema`): the backend's fixed ``columns``, the
    request's identity, what was served, the phase and the queue time (ms)."""
    row = empty_row()
    row.update(columns)
    row.update(
        run_id=plan.run_id, request_index=request.index, request_id=request.request_id,
        session_id=request.session_id, turn=request.turn, phase=phase, prompt_tokens=served.prompt_tokens,
        cached_prompt_tokens=served.cached_prompt_tokens, expected_cached_tokens=request.expected_cached_tokens,
        output_tokens=served.output_tokens, output_tokens_source=served.output_tokens_source,
        max_tokens=request.max_tokens, arrival_ms=request.arrival_ms, queue_ms=queue_ms,
        ttft_ms=served.ttft_ms, tpot_ms=served.tpot_ms, e2e_ms=served.e2e_ms, prefill_ms=served.prefill_ms,
        itl_ms=list(served.itl_ms), status=served.status, http_status=served.http_status, error=served.error,
        output_matches_reference=served.output_matches_reference,
    )
    return row


class _ClosedLoop:
    """Send times under ``c`` clients and session order; picks the oldest sendable request."""

    def __init__(self, requests: Sequence[RunRequest], concurrency: int, start_s: float) -> None:
        self._pending = list(reversed(requests))  # pop() gives trace order
        self._claimed: list[tuple[RunRequest, float | None]] = []
        self._session_done_s: dict[str, float] = {}
        for _ in range(min(concurrency, len(requests))):
            self._claim(start_s)

    def _claim(self, free_s: float) -> None:
        if self._pending:
            request = self._pending.pop()
            self._claimed.append((request, free_s))

    def next(self) -> tuple[RunRequest, float] | None:
        """The claimed request to serve now and its send time (s), or ``None`` when done."""
        best = None
        for position, (request, free_s) in enumerate(self._claimed):
            earlier_turn_waiting = any(other.session_id == request.session_id and other.index < request.index
                                       for other, _ in self._claimed)
            if earlier_turn_waiting:
                continue  # its session's previous turn has not been served yet
            send_s = max(free_s, self._session_done_s.get(request.session_id, free_s))
            if best is None or (send_s, request.index) < (best[1], best[2].index):
                best = (position, send_s, request)
        if best is None:
            return None
        position, send_s, request = best
        self._claimed.pop(position)
        return request, send_s

    def finished(self, request: RunRequest, end_s: float) -> None:
        self._session_done_s[request.session_id] = end_s
        self._claim(end_s)


def run_requests(
    requests: Sequence[RunRequest],
    backend: Backend,
    plan: RunPlan,
    on_row: Callable[[dict[str, Any]], None],
) -> None:
    """Serve ``requests`` (warm-up first, then the rest) and hand each result row to ``on_row``.

    An exception or Ctrl-C propagates after the rows so far were handed over.
    """
    columns = backend.describe()
    warmup, measured = requests[: plan.num_warmup], requests[plan.num_warmup:]
    for phase, batch in (("warmup", warmup), ("measure", measured)):
        loop = _ClosedLoop(batch, plan.concurrency, time.perf_counter())
        while (picked := loop.next()) is not None:
            request, send_s = picked
            start_s = time.perf_counter()
            served = backend.serve(request)
            on_row(result_row(plan, columns, request, served, phase, (start_s - send_s) * 1e3))
            # The client is free once its result is recorded: at concurrency 1 the next request then
            # starts at once, so the runner's own bookkeeping never shows up as queue time.
            loop.finished(request, time.perf_counter())
