"""Load generation: closed and open loop, session order, client queue time, duration, nonce hygiene."""

import asyncio
import math
import time

import numpy as np
import pytest

from kvbench.run.load import LoadConfig, arrival_offsets_s, nonce_line, run_load, with_nonce
from kvbench.run.loop import RunPlan, RunRequest, ServedRequest
from kvbench.workloads.tokenizer import load_tokenizer
from kvbench.workloads.formats.kvbench_trace import Message, TraceRequest


class SleepyBackend:
    """Takes ``service_s`` per request; records send/finish times and the peak in flight."""

    def __init__(self, service_s=0.05):
        self.service_s = service_s
        self.in_flight = self.peak = 0
        self.sent, self.finished = {}, {}

    def describe(self):
        return {"backend": "openai", "model": "fake"}

    async def serve(self, request):
        self.sent[request.index] = time.perf_counter()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.service_s)
        self.in_flight -= 1
        self.finished[request.index] = time.perf_counter()
        return ServedRequest(status="ok", prompt_tokens=request.prompt_tokens, ttft_ms=1.0, e2e_ms=1.0)


def requests_of(sessions):
    """``sessions``: the session id of each request, in trace order; turns count up per session."""
    turns, made = {}, []
    for index, session in enumerate(sessions):
        turns[session] = turns.get(session, -1) + 1
        made.append(RunRequest(index, f"r{index}", session, turns[session], 0.0, np.arange(10, dtype=np.uint32), 4))
    return made


def run(requests, backend, load, num_warmup=0):
    rows = []
    windows = asyncio.run(run_load(requests, backend, RunPlan("t", 1, num_warmup), load, rows.append))
    return rows, windows


def test_closed_loop_keeps_concurrency_and_session_order():
    backend = SleepyBackend()
    requests = requests_of(["a", "a", "b", "c", "a", "d", "e"])
    rows, windows = run(requests, backend, LoadConfig(concurrency=3))
    assert len(rows) == 7 and backend.peak == 3
    for earlier, later in ((0, 1), (1, 4)):  # session a's turns
        assert backend.sent[later] >= backend.finished[earlier]
    blocked = next(r for r in rows if r["request_index"] == 1)
    assert blocked["queue_ms"] >= 40  # waited for turn 0 on the client, outside TTFT
    assert all(w.start_s <= w.end_s for w in windows.values()) and set(windows) == set(range(7))


def test_open_loop_sends_at_due_times_and_caps_in_flight():
    backend = SleepyBackend(service_s=0.01)
    requests = requests_of([f"s{i}" for i in range(20)])
    start = time.perf_counter()
    rows, _ = run(requests, backend, LoadConfig(concurrency=None, request_rate_per_s=100.0, seed=3))
    due = arrival_offsets_s(20, 100.0, 1.0, 3)
    sent = np.array([backend.sent[i] - start for i in range(20)])
    assert np.all(sent >= due - 0.005) and np.all(sent <= due + 0.2)
    capped = SleepyBackend(service_s=0.05)
    run(requests, capped, LoadConfig(concurrency=2, request_rate_per_s=math.inf))
    run(requests, capped, LoadConfig(concurrency=2, request_rate_per_s=1000.0))
    assert capped.peak == 2


def test_arrivals_have_the_asked_mean_and_burstiness():
    poisson = np.diff(arrival_offsets_s(20_000, 4.0, 1.0, 0))
    bursty = np.diff(arrival_offsets_s(20_000, 4.0, 0.25, 0))
    assert poisson.mean() == pytest.approx(0.25, rel=0.05) and bursty.mean() == pytest.approx(0.25, rel=0.1)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # CV = 1 / sqrt(shape)


def test_open_loop_waits_for_the_previous_turn_and_counts_it_as_queue():
    backend = SleepyBackend(service_s=0.1)
    rows, _ = run(requests_of(["a", "a"]), backend, LoadConfig(concurrency=None, request_rate_per_s=1000.0))
    assert backend.sent[1] >= backend.finished[0]
    assert rows[1]["queue_ms"] >= 80


def test_duration_stops_sending_and_warmup_comes_first():
    backend = SleepyBackend(service_s=0.05)
    rows, _ = run(requests_of([f"s{i}" for i in range(40)]), backend, LoadConfig(concurrency=1, duration_s=0.2),
                  num_warmup=2)
    assert [r["phase"] for r in rows[:2]] == ["warmup", "warmup"]
    assert 3 <= len(rows) - 2 <= 8  # ~0.2 s / 0.05 s per request, then no more sends


@pytest.mark.parametrize("config", [dict(concurrency=0), dict(concurrency=None), dict(request_rate_per_s=0),
                                    dict(burstiness=0.0), dict(duration_s=-1.0)])
def test_bad_load_configs_are_refused(config):
    with pytest.raises(ValueError):
        LoadConfig(**config)


def test_nonce_goes_first_and_token_ids_follow_the_text():
    tokenizer = load_tokenizer()
    chat = TraceRequest(id="c", session_id="c", turn=0, arrival_ms=0.0, max_tokens=2, expected_prompt_tokens=1,
                        messages=(Message("system", "Be brief."), Message("user", "hi")))
    plain = TraceRequest(id="p", session_id="p", turn=0, arrival_ms=0.0, max_tokens=2, expected_prompt_tokens=1,
                         prompt="Once upon a time")
    requests = [RunRequest(0, "c", "c", 0, 0.0, tokenizer.render(chat), 2, text=chat),
                RunRequest(1, "p", "p", 0, 0.0, tokenizer.render(plain), 2, text=plain),
                RunRequest(2, "t", "t", 0, 0.0, np.array([7, 8, 9], dtype=np.uint32), 2)]
    changed = with_nonce(requests, "abc123", tokenizer)
    line = nonce_line("abc123")
    assert changed[0].text.messages[0].content == line + "Be brief." and changed[0].text.messages[1].content == "hi"
    assert changed[1].text.prompt == line + "Once upon a time"
    for request in changed[:2]:
        assert np.array_equal(request.token_ids, tokenizer.render(request.text))
        assert request.text.expected_prompt_tokens == request.prompt_tokens
    assert changed[2].token_ids.tolist() == tokenizer.encode(line) + [7, 8, 9]
