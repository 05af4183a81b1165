"""Load generation for backends that take many requests at once (HTTP): closed and open loop.

* **Closed loop** (``concurrency`` N, vLLM's ``--max-concurrency`` with an infinite rate): N clients
  take requests in trace order; each sends its next request as soon as its previous one finished.
* **Open loop** (``request_rate_per_s`` R, ``burstiness`` k): request i is due at the i-th point of a
  renewal process whose gaps are gamma(shape=k, scale=1/(R k)): mean 1/R, k = 1 is Poisson, k < 1
  burstier, k > 1 smoother (vLLM ``bench serve``'s ``--request-rate`` / ``--burstiness``). The first
  request is due at 0. With ``concurrency`` set, at most that many are in flight (a due request waits
  for a slot).
* **Session order** in both: a session's turn k+1 is sent only after turn k finished (its prompt
  carries turn k's reply), even if it is due earlier.
* **Queue time** (``queue_ms``, never part of TTFT): closed loop, from the client taking the request
  to sending it (waiting for the session's previous turn); open loop, from the due time to sending
  it (previous turn, then a concurrency slot). A server's own queue shows up inside TTFT, as it does
  for any client of a real server.
* ``duration_s`` stops *sending* after that long (in-flight requests finish; unsent ones leave no
  row). Warm-up requests run first, closed loop, and are marked ``warmup``.

Cache hygiene (:class:`Hygiene`, applied by the caller before expectations are computed): ``salt``
sends a per-run ``cache_salt`` (the backend's ``run_salt``); ``nonce`` puts a per-run line at the very
start of every prompt (:func:`with_nonce`), which changes every prompt's tokens and so its length and
block boundaries (expectations are computed on the changed prompts); ``off`` sends the trace as is.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

import numpy as np

from kvbench.run.loop import RunPlan, RunRequest, ServedRequest, result_row
from kvbench.workloads.tokenizer import Tokenizer
from kvbench.workloads.formats.kvbench_trace import Message


class Hygiene(str, Enum):
    """How a run keeps earlier runs' (and other users') cache entries from making it look faster."""

    SALT = "salt"    # a per-run cache_salt in every request (vLLM); the prompt tokens are unchanged
    NONCE = "nonce"  # a per-run line at the very start of every prompt; works on any server
    OFF = "off"      # the trace as is: hits on blocks from earlier runs count


def nonce_line(nonce: str) -> str:
    """The line :func:`with_nonce` puts first in every prompt."""
    return f"[kvbench run {nonce}]\n"


def with_nonce(requests: Sequence[RunRequest], nonce: str, tokenizer: Tokenizer) -> list[RunRequest]:
    """``requests`` with :func:`nonce_line` at the very start of every prompt: prefixed to the first
    message's content (chat), to the prompt text, or as its tokens before the token ids (token-id
    workloads). Prompts are re-rendered with ``tokenizer``, so ``token_ids`` match what is sent.

    With ChatML (cl100k) only 3 template tokens precede the nonce, less than a block. A chat template
    that writes a block or more of fixed text before the first message's content (Llama 3.1's date
    preamble) leaves those blocks shared between runs: prefer the salt where the server takes it."""
    line = nonce_line(nonce)
    line_ids = np.asarray(tokenizer.encode(line), dtype=np.uint32)
    changed = []
    for request in requests:
        trace = request.text
        if trace is None:
            ids = np.concatenate([line_ids, np.asarray(request.token_ids, dtype=np.uint32)])
            changed.append(replace(request, token_ids=ids))
            continue
        if trace.messages is not None:
            first, *rest = trace.messages
            trace = replace(trace, messages=(Message(first.role, line + first.content), *rest))
        else:
            trace = replace(trace, prompt=line + (trace.prompt or ""))
        ids = tokenizer.render(trace)
        changed.append(replace(request, text=replace(trace, expected_prompt_tokens=int(ids.shape[0])),
                               token_ids=ids))
    return changed


@dataclass(frozen=True)
class LoadConfig:
    """How requests are sent (see the module docstring). Validated.

    Attributes:
        concurrency: most requests in flight; ``None`` (open loop only) = no cap.
        request_rate_per_s: mean arrival rate; ``math.inf`` = closed loop.
        burstiness: gamma shape of the arrival gaps (1 = Poisson).
        duration_s: stop sending after this many seconds of the measured phase; ``None`` = all requests.
        seed: seeds the arrival gaps.
    """

    concurrency: int | None = 1
    request_rate_per_s: float = math.inf
    burstiness: float = 1.0
    duration_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrency is None and not self.is_open_loop:
            raise ValueError("a closed loop needs a concurrency (or give a request rate)")
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int)
                                             or self.concurrency < 1):
            raise ValueError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if not self.request_rate_per_s > 0:
            raise ValueError(f"request rate must be positive (inf = closed loop), got {self.request_rate_per_s}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be a positive number, got {self.burstiness}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration must be positive, got {self.duration_s}")

    @property
    def is_open_loop(self) -> bool:
        return math.isfinite(self.request_rate_per_s)


def arrival_offsets_s(num_requests: int, rate_per_s: float, burstiness: float, seed: int) -> np.ndarray:
    """Due times (s from the phase start), shape (num_requests,): 0, then cumulative gamma gaps of
    shape ``burstiness`` and mean ``1 / rate_per_s`` (vLLM bench's arrival process)."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate_per_s * burstiness), size=max(num_requests - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])[:num_requests]


class AsyncBackend(Protocol):
    """Serves requests concurrently. ``serve`` records failures in the result instead of raising."""

    async def serve(self, request: RunRequest) -> ServedRequest: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ServiceWindow:
    """When one request was on the wire: seconds from the run's start, send to last byte."""

    start_s: float
    end_s: float


class _Run:
    """State of one :func:`run_load` call: session turns, windows, rows."""

    def __init__(self, requests: Sequence[RunRequest], backend: AsyncBackend, plan: RunPlan,
                 on_row: Callable[[dict[str, Any]], None]) -> None:
        self.backend, self.plan, self.on_row = backend, plan, on_row
        self.columns = backend.describe()
        self.start_s = time.perf_counter()
        self.done = {request.index: asyncio.Event() for request in requests}
        self.previous: dict[int, int] = {}
        last_of_session: dict[str, int] = {}
        for request in requests:
            if request.session_id in last_of_session:
                self.previous[request.index] = last_of_session[request.session_id]
            last_of_session[request.session_id] = request.index
        self.windows: dict[int, ServiceWindow] = {}

    async def previous_turn(self, request: RunRequest) -> None:
        if (previous := self.previous.get(request.index)) is not None:
            await self.done[previous].wait()

    def skip(self, request: RunRequest) -> None:
        self.done[request.index].set()  # unsent: later turns of its session are past the deadline too

    async def serve(self, request: RunRequest, phase: str, queued_since_s: float) -> None:
        try:
            sent_s = time.perf_counter()
            served = await self.backend.serve(request)
            ended_s = time.perf_counter()
            self.windows[request.index] = ServiceWindow(sent_s - self.start_s, ended_s - self.start_s)
            self.on_row(result_row(self.plan, self.columns, request, served, phase, (sent_s - queued_since_s) * 1e3))
        finally:
            self.done[request.index].set()


async def _closed_loop(run: _Run, batch: Sequence[RunRequest], phase: str, concurrency: int,
                       deadline_s: float) -> None:
    pending = iter(batch)  # shared by the clients: each takes the next request in trace order

    async def client() -> None:
        for request in pending:
            taken_s = time.perf_counter()
            if taken_s > deadline_s:
                run.skip(request)
                continue
            await run.previous_turn(request)
            await run.serve(request, phase, taken_s)

    await asyncio.gather(*(client() for _ in range(min(concurrency, len(batch)))))


async def _open_loop(run: _Run, batch: Sequence[RunRequest], phase: str, load: LoadConfig,
                     deadline_s: float) -> None:
    phase_start_s = time.perf_counter()
    due_s = phase_start_s + arrival_offsets_s(len(batch), load.request_rate_per_s, load.burstiness, load.seed)
    slots = asyncio.Semaphore(load.concurrency) if load.concurrency else None

    async def one(request: RunRequest, request_due_s: float) -> None:
        if request_due_s > deadline_s:
            run.skip(request)
            return
        await asyncio.sleep(max(request_due_s - time.perf_counter(), 0.0))
        await run.previous_turn(request)
        async with slots or contextlib.nullcontext():
            await run.serve(request, phase, request_due_s)

    await asyncio.gather(*(one(request, float(due)) for request, due in zip(batch, due_s)))


async def run_load(requests: Sequence[RunRequest], backend: AsyncBackend, plan: RunPlan, load: LoadConfig,
                   on_row: Callable[[dict[str, Any]], None]) -> dict[int, ServiceWindow]:
    """Send ``requests`` (``plan.num_warmup`` first, as warm-up) and hand each row to ``on_row`` as
    soon as it exists. Returns when each sent request was on the wire, by request index.

    Cancellation (Ctrl-C) propagates after the rows so far were handed over.
    """
    run = _Run(requests, backend, plan, on_row)
    warmup, measured = requests[: plan.num_warmup], requests[plan.num_warmup:]
    if warmup:
        await _closed_loop(run, warmup, "warmup", load.concurrency or 1, math.inf)
    deadline_s = time.perf_counter() + load.duration_s if load.duration_s is not None else math.inf
    if load.is_open_loop:
        await _open_loop(run, measured, "measure", load, deadline_s)
    else:
        await _closed_loop(run, measured, "measure", load.concurrency, deadline_s)
    return run.windows
