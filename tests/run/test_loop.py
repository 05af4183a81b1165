"""The runner's closed loop: service order, session order, queue time kept apart from TTFT."""

import time

import numpy as np
import pytest

from kvbench.run.loop import RunPlan, RunRequest, ServedRequest, run_requests

SERVICE_S = 0.02


class SleepingBackend:
    """Takes SERVICE_S per request; records the order it served requests in."""

    def __init__(self):
        self.served = []

    def describe(self):
        return {"backend": "fake", "model": "none"}

    def serve(self, request):
        self.served.append(request.request_id)
        time.sleep(SERVICE_S)
        return ServedRequest("ok", request.prompt_tokens, 0, 1, ttft_ms=SERVICE_S * 1e3, e2e_ms=SERVICE_S * 1e3)


def requests(*sessions):
    return [RunRequest(i, f"{s}{i}", s, 0, 0.0, np.zeros(4, dtype=np.uint32), 1) for i, s in enumerate(sessions)]


def serve(reqs, concurrency, warmup=0):
    backend, rows = SleepingBackend(), []
    run_requests(reqs, backend, RunPlan("test", concurrency, warmup), rows.append)
    return backend.served, rows


def test_concurrency_one_never_queues():
    order, rows = serve(requests("a", "b", "c"), concurrency=1)
    assert order == ["a0", "b1", "c2"]
    assert all(r["queue_ms"] < 50 for r in rows)


def test_concurrency_two_records_the_wait_apart_from_ttft():
    order, rows = serve(requests("a", "b", "c", "d"), concurrency=2)
    assert order == ["a0", "b1", "c2", "d3"]
    assert rows[0]["queue_ms"] < 50
    assert rows[1]["queue_ms"] >= SERVICE_S * 1e3 * 0.9  # sent at once, served after a0
    assert all(r["ttft_ms"] == pytest.approx(SERVICE_S * 1e3) for r in rows)


def test_a_sessions_next_turn_waits_for_the_previous_one():
    # Two clients claim a0 and a1 at once, but a1 is only sent when a0 has finished: its queue time
    # starts then, not at the start of the run.
    order, rows = serve(requests("a", "a", "b"), concurrency=2)
    assert order == ["a0", "a1", "b2"]
    assert rows[1]["queue_ms"] < 50
    order, _ = serve(requests("a", "b", "a"), concurrency=2)
    assert order == ["a0", "b1", "a2"]


def test_warmup_is_served_first_and_marked():
    _, rows = serve(requests("a", "b", "c"), concurrency=1, warmup=2)
    assert [r["phase"] for r in rows] == ["warmup", "warmup", "measure"]


def test_plan_validation():
    with pytest.raises(ValueError):
        RunPlan("x", concurrency=0)
    with pytest.raises(ValueError):
        RunPlan("x", num_warmup=-1)
