"""The one send loop on a virtual clock: closed and open loop, session order, queue time, warm-up,
duration. No real sleeps: every time below is exact."""

import asyncio

import numpy as np
import pytest

from kvbench.request import Phase, Request, RequestRecord, Status
from kvbench.run.clock import VirtualClock
from kvbench.run.loop import LoadConfig, arrival_offsets_s, send_requests


class TimedBackend:
    """Takes ``service_s`` (virtual) per request, ``queue_s`` of it waiting for an engine lock when
    ``exclusive``; records send/finish times, order and the peak in flight."""

    def __init__(self, clock, service_s=0.05, exclusive=False):
        self.clock, self.service_s = clock, service_s
        self.lock = asyncio.Lock() if exclusive else None
        self.in_flight = self.peak = 0
        self.sent, self.finished, self.order = {}, {}, []

    def describe(self):
        return {"backend": "fake", "model": "none"}

    async def serve(self, request):
        self.sent[request.index] = self.clock.now()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        waited_ms = 0.0
        if self.lock is not None:
            await self.lock.acquire()
            waited_ms = (self.clock.now() - self.sent[request.index]) * 1e3
        self.order.append(request.request_id)
        await asyncio.sleep(self.service_s)
        if self.lock is not None:
            self.lock.release()
        self.in_flight -= 1
        self.finished[request.index] = self.clock.now()
        return RequestRecord(
            Status.OK,
            request.num_tokens,
            0,
            1,
            ttft_ms=self.service_s * 1e3,
            e2e_ms=self.service_s * 1e3,
            queue_ms=waited_ms,
        )


def requests_of(sessions):
    """``sessions``: the session id of each request, in trace order; turns count up per session."""
    turns, made = {}, []
    for index, session in enumerate(sessions):
        turns[session] = turns.get(session, -1) + 1
        made.append(
            Request(
                index,
                f"{session}{index}",
                session,
                turns[session],
                np.arange(10, dtype=np.uint32),
                max_tokens=4,
            )
        )
    return made


def run(requests, load, service_s=0.05, exclusive=False):
    clock = VirtualClock()
    backend = TimedBackend(clock, service_s, exclusive)
    seen = []
    records = clock.run(
        send_requests(requests, backend, load, lambda r, rec: seen.append(r.index), clock=clock)
    )
    assert seen == [request.index for request, _ in records]  # on_record saw each one, as it finished
    by_index = {request.index: record for request, record in records}
    return backend, by_index


def test_closed_loop_keeps_concurrency_and_session_order():
    backend, records = run(requests_of(["a", "a", "b", "c", "a", "d", "e"]), LoadConfig(concurrency=3))
    assert len(records) == 7 and backend.peak == 3
    for earlier, later in ((0, 1), (1, 4)):  # session a's turns
        assert backend.sent[later] >= backend.finished[earlier]
    assert records[1].queue_ms == pytest.approx(50.0)  # waited for turn 0 on its client, outside TTFT
    assert records[0].queue_ms == 0.0 and records[2].queue_ms == 0.0
    assert all(r.sent_s <= r.ended_s for r in records.values())
    assert records[1].sent_s == pytest.approx(0.05) and records[1].ended_s == pytest.approx(0.10)


def test_one_engine_at_concurrency_two_serves_in_trace_order_and_counts_the_lock_as_queue():
    backend, records = run(requests_of(["a", "b", "c", "d"]), LoadConfig(concurrency=2), exclusive=True)
    assert backend.order == ["a0", "b1", "c2", "d3"]
    assert [records[i].queue_ms for i in range(4)] == pytest.approx([0.0, 50.0, 50.0, 50.0])
    assert all(r.ttft_ms == pytest.approx(50.0) for r in records.values())


def test_a_sessions_next_turn_goes_before_a_later_request():
    backend, records = run(requests_of(["a", "a", "b"]), LoadConfig(concurrency=2), exclusive=True)
    assert backend.order == ["a0", "a1", "b2"]
    assert records[1].queue_ms == pytest.approx(50.0)  # the wait for turn 0
    backend, _ = run(requests_of(["a", "b", "a"]), LoadConfig(concurrency=2), exclusive=True)
    assert backend.order == ["a0", "b1", "a2"]


def test_concurrency_one_never_queues():
    backend, records = run(requests_of(["a", "b", "c"]), LoadConfig(concurrency=1), exclusive=True)
    assert backend.order == ["a0", "b1", "c2"] and all(r.queue_ms == 0.0 for r in records.values())


def test_open_loop_sends_at_due_times_and_caps_in_flight():
    backend, _ = run(
        requests_of([f"s{i}" for i in range(20)]),
        LoadConfig(concurrency=None, request_rate_per_s=100.0, seed=3),
        service_s=0.01,
    )
    due = arrival_offsets_s(20, 100.0, 1.0, 3)
    assert np.allclose([backend.sent[i] for i in range(20)], due)
    capped, _ = run(
        requests_of([f"s{i}" for i in range(20)]), LoadConfig(concurrency=2, request_rate_per_s=1000.0)
    )
    assert capped.peak == 2
    closed, _ = run(requests_of([f"s{i}" for i in range(20)]), LoadConfig(concurrency=2))
    assert closed.peak == 2


def test_arrivals_have_the_asked_mean_and_burstiness():
    poisson = np.diff(arrival_offsets_s(20_000, 4.0, 1.0, 0))
    bursty = np.diff(arrival_offsets_s(20_000, 4.0, 0.25, 0))
    assert poisson.mean() == pytest.approx(0.25, rel=0.05) and bursty.mean() == pytest.approx(0.25, rel=0.1)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # CV = 1 / sqrt(shape)


def test_open_loop_waits_for_the_previous_turn_and_counts_it_as_queue():
    load = LoadConfig(concurrency=None, request_rate_per_s=1000.0)
    backend, records = run(requests_of(["a", "a"]), load, service_s=0.1)
    assert backend.sent[1] == pytest.approx(backend.finished[0])
    due_1 = arrival_offsets_s(2, 1000.0, 1.0, 0)[1]
    assert records[1].queue_ms == pytest.approx((0.1 - due_1) * 1e3)


def test_duration_stops_sending_and_warmup_comes_first():
    backend, records = run(
        requests_of([f"s{i}" for i in range(40)]), LoadConfig(concurrency=1, duration_s=0.2, num_warmup=2)
    )
    assert [records[i].phase for i in (0, 1)] == [Phase.WARMUP, Phase.WARMUP]
    measured = [r for r in records.values() if r.phase is Phase.MEASURE]
    assert len(measured) == 5  # sent at 0, .05, .10, .15, .20 s of the measured phase; not after


@pytest.mark.parametrize(
    "config",
    [
        dict(concurrency=0),
        dict(concurrency=None),
        dict(request_rate_per_s=0),
        dict(burstiness=0.0),
        dict(duration_s=-1.0),
        dict(num_warmup=-1),
        dict(concurrency=True),
    ],
)
def test_bad_load_configs_are_refused(config):
    with pytest.raises(ValueError):
        LoadConfig(**config)


def test_an_interrupt_keeps_the_records_so_far():
    clock = VirtualClock()
    backend = TimedBackend(clock)
    seen = []

    async def stop_at_third(request):
        if request.index == 2:
            raise KeyboardInterrupt
        return await TimedBackend.serve(backend, request)

    backend.serve = stop_at_third
    with pytest.raises(KeyboardInterrupt):
        clock.run(
            send_requests(
                requests_of(["a", "b", "c", "d"]),
                backend,
                LoadConfig(),
                lambda r, _: seen.append(r.index),
                clock=clock,
            )
        )
    assert seen == [0, 1]


def test_the_virtual_clock_runs_hours_of_service_exactly():
    # 200 requests of 10 s each: 2,000 virtual seconds, which a real clock could not run in a test
    _, records = run(requests_of([f"s{i}" for i in range(200)]), LoadConfig(concurrency=1), service_s=10.0)
    assert len(records) == 200 and records[199].ended_s == pytest.approx(2000.0)
    assert records[100].sent_s == pytest.approx(1000.0)


class DyingBackend(TimedBackend):
    """Serves ``num_alive`` requests, then every connection is refused (the server died)."""

    def __init__(self, clock, num_alive):
        super().__init__(clock)
        self.num_alive = num_alive

    async def serve(self, request):
        if len(self.sent) < self.num_alive:
            return await super().serve(request)
        self.sent[request.index] = self.clock.now()
        await asyncio.sleep(0.01)
        return RequestRecord.failed(request.num_tokens, "connection error: [Errno 111] Connection refused")


@pytest.mark.parametrize(
    "load",
    [
        LoadConfig(concurrency=2, max_connection_failures=3),
        LoadConfig(concurrency=None, request_rate_per_s=0.01, max_connection_failures=3),
    ],
)
def test_a_dead_server_stops_the_loop_after_consecutive_connection_failures(load):
    """A run whose server died once fired every remaining request into connection errors
    (and an open loop waited for each one's due time to do it)."""
    clock = VirtualClock()
    backend = DyingBackend(clock, num_alive=4)
    records = clock.run(send_requests(requests_of("abcdefghijklmnopqrst"), backend, load, clock=clock))
    assert len(records) == 20 and len(backend.sent) <= 4 + 3 + 1  # in flight when the third failure came
    not_sent = [r for _, r in records if (r.error or "").startswith("not sent")]
    assert len(not_sent) >= 12 and all(
        r.sent_s is None and "3 consecutive connection failures" in r.error for r in not_sent
    )
    assert clock.now() < 1500  # the open loop's mean gap is 100 s: it did not wait out all 20


def test_connection_failures_must_be_consecutive():
    clock = VirtualClock()

    class Flaky(TimedBackend):
        async def serve(self, request):
            if request.index % 2:
                return RequestRecord.failed(request.num_tokens, "connection error: reset")
            return await super().serve(request)

    records = clock.run(
        send_requests(
            requests_of("abcdefghij"), Flaky(clock), LoadConfig(max_connection_failures=2), clock=clock
        )
    )
    assert not any((r.error or "").startswith("not sent") for _, r in records)


class HandsBackOnCancel:
    """Takes 10 s per request; cancelled, it returns the request's row instead of raising, as the
    in-process backend does for a request that finished while only its ``--verify`` check was pending."""

    def __init__(self):
        self.sent = []

    def describe(self):
        return {"backend": "fake", "model": "none"}

    async def serve(self, request):
        self.sent.append(request.index)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return RequestRecord(Status.OK, request.num_tokens, 0, 1, ttft_ms=1.0, e2e_ms=1.0)
        raise AssertionError("never cancelled")


@pytest.mark.parametrize(
    "load", [LoadConfig(concurrency=2), LoadConfig(concurrency=2, request_rate_per_s=1000.0)]
)
def test_a_cancel_whose_rows_the_backend_hands_back_still_stops_the_loop(load):
    """SIGTERM during a paged --verify run was lost: the backend's kept row swallowed the cancel, and
    the clients went on to send the next requests."""
    backend, seen = HandsBackOnCancel(), []

    async def main():
        task = asyncio.create_task(
            send_requests(
                requests_of("abcdefgh"), backend, load, lambda request, record: seen.append(request.index)
            )
        )
        await asyncio.sleep(0.05)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:  # the bug: clean up before failing
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=1)
        return task in done and task.cancelled()

    assert asyncio.run(main()) is True
    assert backend.sent == [0, 1] and sorted(seen) == [0, 1]  # both rows kept, nothing sent after the cancel
