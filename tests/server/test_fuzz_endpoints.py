"""Hypothesis over JSON bodies sent to both generation endpoints. Whatever the body, the
answer is a 200 or an OpenAI-shaped 4xx (never a 500, never a traceback), and the server stays healthy."""

import http.client
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_server import LiveServer, tiny_service
from tiny_workloads import TINY_LLAMA

from kvbench.engine.model import default_llama_config, random_model

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-3, 40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["tiny", "", "\ud800", "user", "system", "text", "\x00"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "seed",
    "n",
    "stop",
    "ignore_eos",
    "cache_salt",
    "logprobs",
    "tools",
    "response_format",
    "echo",
]
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "x"]),
        "content": st.one_of(st.text(max_size=20), JSON),
    }
)
VALUES = {
    "model": st.sampled_from(["tiny", "other"]) | JSON,
    "prompt": st.text(max_size=30) | JSON | st.lists(st.integers(-5, 100_300), max_size=6),
    "messages": st.lists(MESSAGE, max_size=3) | JSON,
    "max_tokens": st.integers(-2, 6) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | JSON,
}
BODY = st.fixed_dictionaries({}, optional={name: VALUES.get(name, JSON) for name in FIELDS})


@pytest.fixture(scope="module")
def small(tiny_loaded):
    """A 48-token context: any body the fuzzer makes valid finishes in a few decode steps."""
    loaded = random_model(default_llama_config(**TINY_LLAMA, max_position_embeddings=48))
    server = LiveServer(tiny_service(loaded))
    yield server
    server.stop()


def post(server, path, payload: bytes):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", path, payload, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, data


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=BODY | JSON, chat=st.booleans())
def test_any_json_body_gets_a_200_or_an_openai_4xx(small, body, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        payload = json.dumps(body).encode("utf-8", "surrogatepass")  # lone surrogates as raw bytes too
    except ValueError:
        return
    status, data = post(small, path, payload)
    assert status < 500 and b"Traceback" not in data, (status, data[:300])
    if status != 200:
        error = json.loads(data)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    elif not (isinstance(body, dict) and body.get("stream") is True):
        assert json.loads(data)["usage"]["completion_tokens"] >= 1


def test_the_server_is_healthy_after_the_fuzzing(small):
    status, _ = post(
        small, "/v1/completions", json.dumps({"model": "tiny", "prompt": "ok", "max_tokens": 2}).encode()
    )
    assert status == 200 and small.get("/health")[0] == 200
    assert (
        "kvbench:num_requests_running{" in small.get("/metrics")[1]
        and small.service.counters.num_in_flight == 0
    )
