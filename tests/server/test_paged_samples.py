"""``kvbench serve --engine paged``: the OpenAI ``n`` parameter (n choices from one prefill, usage
counted once for the prompt) through the real ``openai`` client, and /metrics' running / waiting
gauges under concurrency (the scheduler's real numbers, not min(in flight, 1))."""

import threading
import time

import openai
import pytest
from live_server import LiveServer, wait_until_idle
from readiness import LIMIT_S

from kvbench.backends.inprocess import InProcessBackend
from kvbench.backends.openai.metrics import parse_prefix_cache_counters
from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import SamplingParams
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.server.service import EngineService
from kvbench.workloads.tokenizer import load_tokenizer

MODEL = "tiny"


def client_of(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def gauge(text, name):
    line = next(line for line in text.splitlines() if line.startswith(f"kvbench:{name}{{"))
    return float(line.rsplit(" ", 1)[1])


def test_n_choices_through_the_openai_client(paged_live):
    server, engine = paged_live
    client = client_of(server)
    before = parse_prefix_cache_counters(server.get("/metrics")[1])
    copies = engine.scheduler.num_copied_blocks
    prompt = "tell me a story about " * 9  # not a multiple of 16 tokens: the last block is copied
    completion = client.completions.create(
        model=MODEL, prompt=prompt, n=3, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    alone = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert [choice.index for choice in completion.choices] == [0, 1, 2]
    assert {choice.text for choice in completion.choices} == {alone.choices[0].text}  # greedy: all equal
    usage = completion.usage
    assert usage.prompt_tokens == alone.usage.prompt_tokens and usage.completion_tokens == 3 * 6
    assert usage.total_tokens == usage.prompt_tokens + 18
    assert usage.prompt_tokens % 16 and engine.scheduler.num_copied_blocks - copies == 2  # n - 1 copies
    after = parse_prefix_cache_counters(server.get("/metrics")[1])
    assert after.queries_tokens - before.queries_tokens == usage.prompt_tokens + alone.usage.prompt_tokens
    assert alone.usage.prompt_tokens_details.cached_tokens > 0  # the n samples' prompt stayed cached
    seeded, again = (
        client.chat.completions.create(
            model=MODEL,
            n=4,
            max_tokens=8,
            temperature=1.0,
            seed=11,
            messages=[{"role": "user", "content": "pick words"}],
            extra_body={"ignore_eos": True},
        )
        for _ in range(2)
    )
    texts = [choice.message.content for choice in seeded.choices]
    assert len(set(texts)) == 4 and texts == [choice.message.content for choice in again.choices]
    assert all(choice.finish_reason == "length" for choice in seeded.choices)
    assert seeded.usage.completion_tokens == 32
    engine.check_invariants()


def test_n_streamed_choices_interleave_with_their_index(paged_live):
    server, engine = paged_live
    client = client_of(server)
    kwargs = dict(
        model=MODEL,
        n=3,
        max_tokens=7,
        temperature=1.0,
        seed=5,
        extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": "stream three answers"}],
    )
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    texts, roles, finish, indexes = {}, set(), {}, []
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        indexes.append(choice.index)
        texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        if choice.delta.role:
            roles.add(choice.index)
        if choice.finish_reason:
            finish[choice.index] = choice.finish_reason
    assert roles == {0, 1, 2} and finish == {0: "length", 1: "length", 2: "length"}
    assert [texts[i] for i in range(3)] == [choice.message.content for choice in whole.choices]
    assert indexes != sorted(indexes)  # the choices' tokens interleave, as they are sampled side by side
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 21
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    engine.check_invariants()


def test_a_client_leaving_a_streamed_n_request_frees_every_samples_blocks(paged_live):
    server, engine = paged_live
    body = {
        "model": MODEL,
        "prompt": "a long story " * 20,
        "max_tokens": 900,
        "n": 3,
        "stream": True,
        "ignore_eos": True,
    }
    status, events = server.leave_stream(body, 6)  # the client leaves after a few tokens of each choice
    assert status == 200 and {event["choices"][0]["index"] for event in events} == {0, 1, 2}
    wait_until_idle(engine)  # the samples were stopped
    engine.check_invariants()
    assert engine.scheduler.pool.num_used_blocks == 0


def test_n_refused_in_one_line_where_not_served(paged_live, live):
    server, _ = paged_live
    status, body = server.post("/v1/completions", {"model": MODEL, "prompt": "hi", "n": 129})
    assert status == 400 and "between 1 and 128" in body["error"]["message"]
    status, body = live.post(
        "/v1/chat/completions", {"model": MODEL, "n": 2, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 400 and body["error"]["param"] == "n" and "--engine paged" in body["error"]["message"]


@pytest.fixture(scope="module")
def two_seq_server(tiny_loaded):
    """A paged engine that runs at most 2 sequences per step, so a third request waits."""
    engine = PagedEngine(tiny_loaded, PagedConfig(CacheConfig(capacity_blocks=512), max_num_seqs=2))
    server = LiveServer(EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer()))
    yield server, engine
    server.stop()


def test_running_and_waiting_gauges_are_the_schedulers_under_concurrency(two_seq_server):
    server, engine = two_seq_server
    client, seen = client_of(server), []

    def one(i):
        client.completions.create(
            model=MODEL, prompt=f"request {i} " * 5, max_tokens=40, extra_body={"ignore_eos": True}
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + LIMIT_S
    while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
        text = server.get("/metrics")[1]
        seen.append((gauge(text, "num_requests_running"), gauge(text, "num_requests_waiting")))
        time.sleep(0.01)
    for thread in threads:
        thread.join(timeout=LIMIT_S)
    assert max(running for running, _ in seen) == 2  # several at once, never above --max-num-seqs
    assert max(waiting for _, waiting in seen) >= 1
    assert all(running <= 2 and running + waiting <= 5 for running, waiting in seen)
    text = server.get("/metrics")[1]
    assert gauge(text, "num_requests_running") == 0 == gauge(text, "num_requests_waiting")
