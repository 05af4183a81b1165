"""The OpenAI-compatible app over the tiny model: wire format, cached_tokens, salts, errors, metrics,
one request at a time, and a vanished client stopping its request."""

import http.client
import json
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from readiness import LIMIT_S

from kvbench.backends.openai.metrics import parse_prefix_cache_counters
from kvbench.request import Message
from kvbench.workloads.tokenizer import load_tokenizer

MODEL = "tiny"
PROMPT_IDS = list(range(2000, 2040))  # 40 tokens: (40 - 1) // 16 = 2 blocks = 32 tokens may hit


def stream_events(live, path, body, stop_after=None):
    """POST ``body`` and read its SSE events: ``(status, [(arrival_s, data), ...])``."""
    connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    events = []
    while line := response.readline():
        if line.startswith(b"data: "):
            events.append((time.perf_counter(), line[6:].strip().decode()))
            if stop_after is not None and len(events) >= stop_after:
                break
    connection.close()
    return response.status, events


def counters(live):
    return parse_prefix_cache_counters(live.get("/metrics")[1])


def test_chat_stream_follows_openai_and_ends_with_usage(live):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello there"}]
    status, events = stream_events(
        live,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 4,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
            "stream_options": {"include_usage": True},
            "cache_salt": "wire",
        },
    )
    assert status == 200 and events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 4 and all(
        c["object"] == "chat.completion.chunk" and c["usage"] is None for c in content
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    expected_prompt = len(load_tokenizer().render_messages([Message(**m) for m in messages]))
    assert chunks[-1]["usage"] == {
        "prompt_tokens": expected_prompt,
        "completion_tokens": 4,
        "total_tokens": expected_prompt + 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_streamed_text_equals_the_whole_response_and_usage_is_only_sent_when_asked(live):
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        "cache_salt": "text",
    }
    status, whole = live.post("/v1/completions", body)
    assert status == 200 and whole["object"] == "text_completion"
    _, events = stream_events(live, "/v1/completions", {**body, "stream": True})
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all("usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert whole["usage"]["completion_tokens"] == 5


def test_return_token_ids_puts_each_tokens_id_on_its_chunk(live):
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
        "cache_salt": "ids",
    }
    _, with_ids = stream_events(live, "/v1/completions", {**body, "return_token_ids": True})
    _, without = stream_events(live, "/v1/completions", body)
    chunks = [json.loads(data)["choices"][0] for _, data in with_ids[:-1]]
    ids = [choice["token_ids"] for choice in chunks if "token_ids" in choice]
    assert len(ids) == 5 and all(len(one) == 1 for one in ids)  # vLLM's shape: a list per chunk
    tokenizer = load_tokenizer()
    texts = [choice["text"] for choice in chunks if "token_ids" in choice]
    # a token that ends inside a multi-byte character streams no text until the character completes
    # (sampled at temperature 1, so such tokens come and go): the chunks' text adds up to the ids' text
    assert "".join(texts) == tokenizer.decode([i for one in ids for i in one])
    assert all("token_ids" not in json.loads(data)["choices"][0] for _, data in without[:-1])


def test_cached_tokens_always_present_floored_to_blocks_and_separated_by_salt(live):
    def cached(salt):
        body = {"model": MODEL, "prompt": PROMPT_IDS, "max_tokens": 1}
        if salt is not None:
            body["cache_salt"] = salt
        status, response = live.post("/v1/completions", body)
        assert status == 200
        return response["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("tenant-a") == 0  # a miss reports 0, not nothing
    assert cached("tenant-a") == 32  # (40 - 1) // 16 blocks of 16
    assert cached("tenant-b") == 0
    assert cached(None) == 0
    assert cached(None) == 32


@pytest.mark.parametrize(
    "body,status,needle",
    [
        (b'{"model": "tiny", "prompt": ', 400, "JSON"),
        ({"model": "gpt-nope", "prompt": "hi"}, 404, "does not exist"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": [5] * 8190, "max_tokens": 16}, 400, "maximum context length"),
        ({"model": MODEL, "prompt": [100_300], "max_tokens": 1}, 400, "vocabulary"),
        ({"model": MODEL, "prompt": "hi", "n": 2}, 400, "n must be 1"),
        ({"model": MODEL, "prompt": ""}, 400, "empty"),
        ({"model": MODEL}, 400, "prompt"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ],
)
def test_bad_requests_get_an_openai_error_and_the_server_keeps_serving(live, body, status, needle):
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    got_status, response = live.post(path, body)
    assert got_status == status
    assert (
        set(response["error"]) == {"message", "type", "param", "code"}
        and needle in response["error"]["message"]
    )
    assert live.post("/v1/completions", {"model": MODEL, "prompt": "still here", "max_tokens": 1})[0] == 200


def test_models_and_health(live):
    assert json.loads(live.get("/v1/models")[1])["data"][0]["id"] == MODEL
    assert live.get("/health")[0] == 200


def test_metrics_count_tokens_like_vllm_and_reset_empties_the_cache(live):
    before = counters(live)
    body = {"model": MODEL, "prompt": list(range(3000, 3050)), "max_tokens": 1, "cache_salt": "metrics"}
    usages = [live.post("/v1/completions", body)[1]["usage"] for _ in range(2)]
    after = counters(live)
    assert after.family == "kvbench:prefix_cache_queries_total"
    assert after.queries_tokens - before.queries_tokens == sum(u["prompt_tokens"] for u in usages) == 100
    hits = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert after.hits_tokens - before.hits_tokens == hits == 48
    assert live.post("/reset_prefix_cache", {})[0] == 200
    assert live.post("/v1/completions", body)[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_metrics_parse_with_prometheus_own_parser_as_typed_families(live):
    body = {"model": MODEL, "prompt": list(range(4000, 4040)), "max_tokens": 2, "cache_salt": "prometheus"}
    assert [live.post("/v1/completions", body)[0] for _ in range(2)] == [200, 200]
    families = {family.name: family for family in text_string_to_metric_families(live.get("/metrics")[1])}
    counters = {name for name, family in families.items() if family.type == "counter"}
    assert counters == {
        f"kvbench:{name}"
        for name in (
            "prefix_cache_queries",
            "prefix_cache_hits",
            "prompt_tokens",
            "generation_tokens",
            "request_success",
            "request_failure",
            "request_abort",
        )
    }
    assert {
        families[f"kvbench:{name}"].type for name in ("num_requests_running", "num_requests_waiting")
    } == {"gauge"}
    assert all(family.type != "unknown" and len(family.samples) == 1 for family in families.values())
    [queries] = families["kvbench:prefix_cache_queries"].samples
    [hits] = families["kvbench:prefix_cache_hits"].samples
    assert queries.name == "kvbench:prefix_cache_queries_total" and queries.labels == {"model_name": MODEL}
    assert hits.name == "kvbench:prefix_cache_hits_total"
    assert (queries.value, hits.value) == (
        live.metric("prefix_cache_queries_total"),
        live.metric("prefix_cache_hits_total"),
    )
    assert queries.value >= 80 and hits.value >= 32  # this test's two requests: 40 + 40 queried, 32 hit
    [success] = families["kvbench:request_success"].samples
    assert success.value == live.metric("request_success_total") >= 2


def test_one_request_at_a_time_so_concurrent_streams_do_not_overlap(live):
    spans = {}

    def send(name):
        body = {
            "model": MODEL,
            "prompt": f"request {name}",
            "max_tokens": 30,
            "ignore_eos": True,
            "stream": True,
        }
        _, events = stream_events(live, "/v1/completions", body)
        content = [t for t, data in events if data != "[DONE]" and json.loads(data)["choices"][0]["text"]]
        spans[name] = (content[0], content[-1])

    threads = [threading.Thread(target=send, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=LIMIT_S)
    (a_first, a_last), (b_first, b_last) = spans["a"], spans["b"]
    assert a_last <= b_first or b_last <= a_first  # the second waited (queueing shows in its TTFT)


def test_a_client_that_leaves_stops_its_request(live):
    succeeded = live.metric("request_success_total")
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": 8000, "ignore_eos": True, "stream": True}
    status, events = stream_events(live, "/v1/completions", body, stop_after=3)
    assert status == 200 and len(events) == 3
    start = time.perf_counter()
    status, response = live.post("/v1/completions", {"model": MODEL, "prompt": "next", "max_tokens": 1})
    assert status == 200 and time.perf_counter() - start < 20
    assert live.metric("request_success_total") == succeeded + 1  # the abandoned request never finished
    assert live.metric("num_requests_running") == 0


def test_scheduler_gauges_help_says_they_count_sequences(live):
    """vLLM's gauges count scheduler sequences: each of n parallel samples is one once forked."""
    families = {family.name: family for family in text_string_to_metric_families(live.get("/metrics")[1])}
    for name in ("num_requests_running", "num_requests_waiting"):
        help_text = families[f"kvbench:{name}"].documentation
        assert (
            help_text.startswith("Sequences ")
            and "each of n parallel samples counts once forked" in help_text
        )
