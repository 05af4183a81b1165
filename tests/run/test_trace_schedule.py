"""``--schedule trace``: the loop sends at the trace's own times (scaled), keeps session order, and
records due / sent / end times. On the virtual clock (exact) and once on the wall clock."""

import asyncio
import math
from dataclasses import replace

import numpy as np
import pytest

from kvbench.request import Request, RequestRecord, Status
from kvbench.results.rows import ResultRow
from kvbench.results.timeline import replay_lag
from kvbench.run.clock import WALL_CLOCK, VirtualClock
from kvbench.run.loop import LoadConfig, send_requests

ARRIVALS_S = (10.0, 10.5, 12.0, 12.1, 15.0)  # gaps 0.5, 1.5, 0.1, 2.9 s


class SleepBackend:
    def __init__(self, clock, service_s):
        self.clock, self.service_s, self.sent = clock, service_s, {}

    def describe(self):
        return {"backend": "fake", "model": "none"}

    async def serve(self, request):
        self.sent[request.index] = self.clock.now()
        await self.clock.sleep(self.service_s)
        return RequestRecord(Status.OK, request.num_tokens, 0, 1, ttft_ms=1.0, e2e_ms=self.service_s * 1e3)


def trace(sessions=("a", "b", "c", "d", "e")):
    return [
        Request(i, f"r{i}", session, 0, np.arange(8, dtype=np.uint32), arrival_s=arrival, max_tokens=4)
        for i, (session, arrival) in enumerate(zip(sessions, ARRIVALS_S))
    ]


def replay(requests, time_scale, service_s=0.05, clock=None, concurrency=None):
    clock = clock or VirtualClock()
    backend = SleepBackend(clock, service_s)
    load = LoadConfig(concurrency=concurrency, time_scale=time_scale)
    records = (
        clock.run(send_requests(requests, backend, load, clock=clock))
        if isinstance(clock, VirtualClock)
        else asyncio.run(send_requests(requests, backend, load, clock=clock))
    )
    return sorted(records, key=lambda pair: pair[0].index)


@pytest.mark.parametrize("time_scale", [1.0, 10.0, 0.5])
def test_requests_are_sent_at_the_traces_gaps_divided_by_the_time_scale(time_scale):
    records = replay(trace(), time_scale)
    due = [record.due_s for _, record in records]
    expected = [(a - ARRIVALS_S[0]) / time_scale for a in ARRIVALS_S]
    assert due == pytest.approx(expected, abs=1e-9)
    # no lag on a free server
    assert [record.sent_s for _, record in records] == pytest.approx(expected, abs=1e-9)
    assert [record.ended_s - record.sent_s for _, record in records] == pytest.approx([0.05] * 5)


def test_a_sessions_next_turn_waits_for_the_previous_one_and_its_lag_shows():
    requests = [replace(r, turn=t) for r, t in zip(trace(("s", "s", "x", "x", "s")), (0, 1, 0, 1, 2))]
    records = replay(requests, 1.0, service_s=1.0)  # turn 0 of s ends at 1.0, turn 1 was due at 0.5
    by_index = {request.index: record for request, record in records}
    assert by_index[1].due_s == pytest.approx(0.5) and by_index[1].sent_s == pytest.approx(1.0)
    assert by_index[3].sent_s == pytest.approx(3.0)  # x: turn 0 at 2.0 ends 3.0; turn 1 due 2.1
    # due 5.0, s's turn 1 ended at 2.0: the think time is kept
    assert by_index[4].sent_s == pytest.approx(5.0)
    rows = [ResultRow.of("run", {}, request, record) for request, record in records]
    lag = replay_lag(rows)
    assert lag.num_requests == 5 and lag.max_ms == pytest.approx(900.0)
    assert lag.p50_ms == pytest.approx(0.0, abs=1e-6)
    assert [row.end_ms for row in rows] == pytest.approx([1000.0, 2000.0, 3000.0, 4000.0, 6000.0])


def test_concurrency_caps_a_trace_replay():
    records = replay(trace(), 100.0, service_s=1.0, concurrency=1)  # all due within 50 ms, 1 s each
    sent = [record.sent_s for _, record in records]
    assert sent == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])


def test_on_the_wall_clock_a_replay_keeps_its_due_times_within_a_tolerance():
    records = replay(trace(), 4.0, service_s=0.005, clock=WALL_CLOCK)  # 5 requests over 1.25 s, gaps >= 25 ms
    lags_ms = [(record.sent_s - record.due_s) * 1e3 for _, record in records]
    assert all(0 <= lag < 100 for lag in lags_ms), lags_ms  # 2 cores shared by 8 agents: a generous bound
    gaps = np.diff([record.due_s for _, record in records])
    assert gaps == pytest.approx(np.diff(ARRIVALS_S) / 4.0, abs=1e-9)
    sent_gaps = np.diff([record.sent_s for _, record in records])
    assert sent_gaps == pytest.approx(gaps, abs=0.1)


def test_a_trace_replay_refuses_a_rate_and_a_bad_scale():
    with pytest.raises(ValueError, match="drop --request-rate"):
        LoadConfig(request_rate_per_s=2.0, time_scale=1.0)
    with pytest.raises(ValueError, match="--time-scale"):
        LoadConfig(concurrency=None, time_scale=0.0)
    assert LoadConfig(concurrency=None, time_scale=2.0).is_open_loop and math.isinf(
        LoadConfig().request_rate_per_s
    )
