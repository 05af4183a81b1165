"""Cross-site and keyless access refused; text, usage and endpoints as
OpenAI and vLLM clients expect them."""

import http.client
import json

import pytest
from live_server import LiveServer, tiny_service

from kvbench.server.guards import GuardConfig
from kvbench.server.text import TextStream
from kvbench.workloads.tokenizer import load_tokenizer

MODEL = "tiny"

MULTIBYTE = "emoji 🙂🚀, accents déjà vu, CJK 漢字かな, math ∑∫ — done"


def request(live, method, path, body=b"", headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    connection.request(method, path, body, headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, json.loads(data) if data.startswith(b"{") else data


@pytest.fixture(scope="module")
def guarded(tiny_loaded):
    server = LiveServer(tiny_service(tiny_loaded), GuardConfig.for_bind("127.0.0.1", api_key="s3cret"))
    yield server
    server.stop()


KEY = {"Authorization": "Bearer s3cret"}


def test_cross_site_reset_is_refused(guarded):
    """Was: a text/plain POST from any Origin reset the cache (200), and any Host was served."""
    status, body = request(
        guarded,
        "POST",
        "/reset_prefix_cache",
        b"x",
        {**KEY, "Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    status, body = request(guarded, "POST", "/reset_prefix_cache", b"", {**KEY, "Host": "evil.example:8000"})
    assert (
        status == 400
        and body["error"]["code"] == "invalid_host"
        and "--allowed-host" in body["error"]["message"]
    )
    assert request(guarded, "POST", "/reset_prefix_cache", b"", {**KEY, "Host": "localhost:1234"})[0] == 200
    assert (
        request(guarded, "POST", "/reset_prefix_cache", b"", {**KEY, "Content-Type": "text/plain"})[0] == 200
    )


def test_api_key_guards_every_route_but_health(guarded):
    for method, path in (
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/v1/completions"),
        ("POST", "/tokenize"),
    ):
        status, body = request(guarded, method, path, b"{}", {"Content-Type": "application/json"})
        assert status == 401 and body["error"]["code"] == "invalid_api_key", path
        assert request(guarded, method, path, b"{}", {"Authorization": "Bearer wrong"})[0] == 401
    assert request(guarded, "GET", "/health")[0] == 200
    status, body = request(
        guarded,
        "POST",
        "/v1/completions",
        json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode(),
        {**KEY, "Content-Type": "application/json"},
    )
    assert status == 200 and body["usage"]["completion_tokens"] == 1


def test_bind_rules():
    assert set(GuardConfig.for_bind("127.0.0.1").allowed_hosts) == {"127.0.0.1", "localhost"}
    assert GuardConfig.for_bind("0.0.0.0").allowed_hosts == ("*",)
    assert GuardConfig.for_bind("0.0.0.0", ("Bench.Example",)).allowed_hosts == ("bench.example",)
    assert "[::1]" in GuardConfig.for_bind("::1").allowed_hosts
    with pytest.raises(ValueError, match="max_body_bytes"):
        GuardConfig(max_body_bytes=0)


@pytest.mark.parametrize("stops", [(), ("🚀",), ("漢字", "zzz")])
def test_text_stream_keeps_multibyte_characters_whole_and_stops_before_a_stop_string(stops):
    """Was: each token decoded alone, "emoji 🙂🚀" came back "emoji 🙂���"."""
    tokenizer = load_tokenizer()
    ids = tokenizer.encode(MULTIBYTE)
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # some tokens are parts of characters
    stream = TextStream(tokenizer, stops)
    pieces = [stream.push(t) for t in ids] + [stream.finish()]
    expected = MULTIBYTE[: min([MULTIBYTE.find(s) for s in stops if s in MULTIBYTE], default=len(MULTIBYTE))]
    assert "".join(pieces) == stream.text == expected and "\ufffd" not in "".join(pieces)
    assert stream.stopped == bool(stops)


def test_multibyte_text_round_trips_through_tokenize_and_detokenize(live):
    status, tokenized = request(
        live,
        "POST",
        "/tokenize",
        json.dumps({"prompt": MULTIBYTE}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200 and tokenized["tokens"] == load_tokenizer().encode(MULTIBYTE)
    assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] == 8192
    status, detokenized = request(
        live,
        "POST",
        "/detokenize",
        json.dumps({"tokens": tokenized["tokens"]}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200 and detokenized == {"prompt": MULTIBYTE}


def test_tokenize_counts_what_a_chat_request_prefills(live):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": MULTIBYTE}]
    _, tokenized = request(
        live,
        "POST",
        "/tokenize",
        json.dumps({"model": MODEL, "messages": messages}).encode(),
        {"Content-Type": "application/json"},
    )
    status, response = live.post(
        "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1}
    )
    assert status == 200 and response["usage"]["prompt_tokens"] == tokenized["count"]
    assert (
        request(
            live,
            "POST",
            "/tokenize",
            b'{"prompt": "a", "messages": []}',
            {"Content-Type": "application/json"},
        )[0]
        == 400
    )
    assert (
        request(live, "POST", "/detokenize", b'{"tokens": [100300]}', {"Content-Type": "application/json"})[
            1
        ]["error"]["param"]
        == "tokens"
    )


def _stream_texts(live, body):
    connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    connection.request(
        "POST", "/v1/completions", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    chunks = [json.loads(line[6:]) for line in response.read().splitlines() if line.startswith(b"data: {")]
    connection.close()
    return chunks


def test_stop_ends_generation_before_the_stop_string_streamed_and_not(live):
    body = {"model": MODEL, "prompt": "Once upon", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    status, whole = live.post("/v1/completions", body)
    text = whole["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    status, stopped = live.post("/v1/completions", {**body, "stop": [stop]})
    assert status == 200 and stopped["choices"][0]["text"] == text[: text.find(stop)]
    assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["usage"]["completion_tokens"] < 12
    chunks = _stream_texts(live, {**body, "stop": stop})
    assert "".join(c["choices"][0]["text"] for c in chunks) == stopped["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(live):
    chunks = _stream_texts(
        live,
        {
            "model": MODEL,
            "prompt": "count",
            "max_tokens": 3,
            "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    counted = [c["usage"]["completion_tokens"] for c in chunks]
    assert counted == [1, 2, 3, 3, 3]  # 3 tokens, the finish chunk, the usage chunk
    assert (
        chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0} and chunks[-1]["choices"] == []
    )


def test_models_root_head_metrics_and_chat_default_budget(live):
    _, models = request(live, "GET", "/v1/models")
    assert models["data"][0]["root"] == MODEL and models["data"][0]["max_model_len"] == 8192
    status, body = request(live, "HEAD", "/metrics")
    assert status == 200 and body == b""
    assert live.service.default_max_tokens(100) == 8092  # chat without max_tokens: the rest of the context
    assert live.service.default_max_tokens(9000) == 1  # -> the context-length error, blaming the prompt
