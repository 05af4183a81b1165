"""Every error of ``/v1/messages`` is Anthropic's ``{"type": "error", "error": {"type", "message"}}``
with the type Anthropic gives its status (a guard's 401/413/415, validation's 400, an unknown model's
404, the connection cap's 503, a stopped request's 500 and a stream's error event), read back through
the real ``anthropic`` SDK against a live server; the OpenAI routes keep OpenAI's shape."""

import http.client
import json
import signal
import threading
import urllib.request

import anthropic
import pytest
from live_server import MODEL, LiveServer, tiny_service
from readiness import wait_until
from serve_process import ServeProcess

from kvbench.server.connections import ConnectionLimits
from kvbench.server.guards import GuardConfig

pytestmark = [pytest.mark.engine, pytest.mark.server]

HI = [{"role": "user", "content": "hi"}]
KEY = "secret-key"


def client_of(server: LiveServer, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url.removesuffix("/v1"), api_key=api_key, max_retries=0, timeout=120
    )


def assert_anthropic(body: dict, kind: str) -> str:
    """``body`` is exactly Anthropic's error shape of type ``kind``; its message."""
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    assert body["error"]["message"], body
    return body["error"]["message"]


@pytest.fixture(scope="module")
def guarded(tiny_loaded):
    """A server with ``--api-key`` and a 4 KiB body limit."""
    server = LiveServer(tiny_service(tiny_loaded), GuardConfig(api_key=KEY, max_body_bytes=4096))
    yield server
    server.stop()


def test_validation_and_unknown_model_through_the_sdk(live):
    client = client_of(live)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=0, messages=HI)
    assert refused.value.type == "invalid_request_error"
    assert refused.value.api_message.startswith("max_tokens")  # the field, in place of OpenAI's param
    assert_anthropic(refused.value.body, "invalid_request_error")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-nonexistent", max_tokens=4, messages=HI)
    assert missing.value.type == "not_found_error" and "claude-nonexistent" in missing.value.api_message
    assert_anthropic(missing.value.body, "not_found_error")


@pytest.mark.parametrize(
    "payload,kind,status",
    [
        (b"{not json", "invalid_request_error", 400),
        (b"", "invalid_request_error", 400),
        (b'{"model": "tiny", "max_tokens": 4, "messages": "hi"}', "invalid_request_error", 400),
    ],
    ids=["malformed", "empty", "wrong-type"],
)
def test_raw_refusals_are_anthropic_shaped(live, payload, kind, status):
    got, body = live.post_raw("/v1/messages", payload)
    assert got == status
    assert_anthropic(body, kind)


def test_unsupported_content_type_and_method(live):
    status, body = live.post_raw(
        "/v1/messages", b"model=tiny", content_type="application/x-www-form-urlencoded"
    )
    assert status == 415 and "JSON" in assert_anthropic(body, "invalid_request_error")
    connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)
    connection.request("GET", "/v1/messages")
    response = connection.getresponse()
    assert response.status == 405
    assert_anthropic(json.loads(response.read()), "invalid_request_error")
    connection.close()


def test_the_openai_routes_keep_openais_shape(live):
    status, body = live.post("/v1/completions", {"model": "other", "prompt": "hi", "max_tokens": 1})
    assert status == 404 and body["error"]["param"] == "model" and body["error"]["code"] == "model_not_found"
    assert "type" not in body


def test_a_wrong_key_is_an_authentication_error_and_x_api_key_is_accepted(guarded):
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client_of(guarded, "wrong").messages.create(model=MODEL, max_tokens=1, messages=HI)
    assert refused.value.type == "authentication_error"
    assert_anthropic(refused.value.body, "authentication_error")
    answer = client_of(guarded, KEY).messages.create(model=MODEL, max_tokens=1, messages=HI)  # x-api-key
    assert answer.usage.output_tokens == 1
    status, body = guarded.post("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"  # OpenAI's shape there


def test_a_body_over_the_limit_is_request_too_large(guarded):
    with pytest.raises(anthropic.APIStatusError) as refused:
        client_of(guarded, KEY).messages.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "word " * 2000}]
        )
    assert refused.value.status_code == 413 and refused.value.type == "request_too_large"
    assert "4,096 bytes" in assert_anthropic(refused.value.body, "request_too_large")


def test_the_connection_cap_answers_overloaded(tiny_loaded):
    server = LiveServer(tiny_service(tiny_loaded), limits=ConnectionLimits(max_connections=1))
    busy = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        busy.request(
            "POST",
            "/v1/messages",
            json.dumps({"model": MODEL, "max_tokens": 4000, "stream": True, "messages": HI}),
            {"Content-Type": "application/json"},
        )
        stream = busy.getresponse()
        assert stream.readline().startswith(b"event: message_start")  # the one connection is busy
        with pytest.raises(anthropic.InternalServerError) as refused:
            client_of(server).messages.create(model=MODEL, max_tokens=1, messages=HI)
        assert refused.value.status_code == 503 and refused.value.type == "overloaded_error"
        assert "--max-connections" in refused.value.api_message
    finally:
        busy.close()
        server.stop()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _running(url: str) -> int:
    """``kvbench:num_requests_running`` of the server at ``url`` (the API root)."""
    text = _get(url.removesuffix("/v1") + "/metrics")
    return int(
        float(
            next(
                line for line in text.splitlines() if line.startswith("kvbench:num_requests_running")
            ).split()[-1]
        )
    )


def _call(client: anthropic.Anthropic, model: str, stream: bool, outcome: dict) -> None:
    """One long request of ``model``; its SDK error (if any) in ``outcome["error"]``."""
    try:
        if stream:
            with client.messages.stream(model=model, max_tokens=4000, messages=HI) as events:
                for _ in events:
                    outcome["started"] = True
        else:
            client.messages.create(model=model, max_tokens=4000, messages=HI)
    except anthropic.APIStatusError as exc:
        outcome["error"] = exc


def test_requests_stopped_by_sigterm_get_api_errors_whole_and_streamed():
    server = ServeProcess("--engine", "paged")
    try:
        client = anthropic.Anthropic(
            base_url=server.url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=300
        )
        model = json.loads(_get(server.url + "/models"))["data"][0]["id"]
        whole, streamed = {}, {}
        threads = [
            threading.Thread(target=_call, args=(client, model, False, whole), daemon=True),
            threading.Thread(target=_call, args=(client, model, True, streamed), daemon=True),
        ]
        for thread in threads:
            thread.start()
        wait_until(
            lambda: streamed.get("started") and _running(server.url) >= 2,
            "two requests running",
            ended=lambda: None if all(t.is_alive() for t in threads) else f"ended: {whole} {streamed}",
        )
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=120)
    finally:
        server.stop()
    assert isinstance(whole.get("error"), anthropic.InternalServerError), (whole, server.log())
    assert whole["error"].status_code == 500 and whole["error"].type == "api_error"
    assert "stopping" in assert_anthropic(whole["error"].body, "api_error")
    assert streamed["error"].type == "api_error" and "stopping" in streamed["error"].api_message
