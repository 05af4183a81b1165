"""Memory, event-loop stalls, abandoned requests and client mistakes.

Each test reproduces a fault found by a hostile client: the server must answer every client mistake
with an OpenAI-shaped 4xx naming the field, keep its memory bounded and keep serving."""

import http.client
import json
import socket
import threading
import time

import pytest

MODEL = "tiny"


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_distinct_rejected_huge_requests_do_not_grow_memory(live):
    """Was +9.3 MB kept per rejected 2.5 MB chat request (the memo stored every message)."""

    def send(i):
        text = f"{i} " + "lorem ipsum dolor " * 140_000  # 2.5 MB, far beyond the 8,192-token context
        status, body = live.post(
            "/v1/chat/completions",
            {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": text}]},
        )
        assert status == 400 and body["error"]["code"] == "context_length_exceeded"
        assert body["error"]["param"] == "messages"

    send(-1)  # warm-up: buffers that any first request allocates
    before = rss_bytes()
    for i in range(20):
        send(i)
    growth_mb = (rss_bytes() - before) / 2**20
    assert growth_mb < 40, f"RSS grew {growth_mb:.0f} MB over 20 rejected requests"
    assert len(live.service.tokenizer._segments) < 10


def _declared_upload(live, num_bytes: int) -> tuple[int, dict]:
    """Declare a ``num_bytes`` JSON body, send its first MiB and read the answer (as ``curl`` does
    with ``Expect: 100-continue``, a client learns the limit before sending the rest)."""
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=30)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {num_bytes}\r\n\r\n".encode()
        + b'{"model": "tiny", "prompt": "'
        + b"x" * (1 << 20)
    )
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = json.loads(response.read())
    sock.close()
    return response.status, body


def _chunked_upload(live, num_bytes: int) -> int | None:
    """Send a body of ``num_bytes`` chunked (no Content-Length); the status, or None if the server
    closed the connection before the client could read it (it answered while the client still sent)."""
    payload = b'{"model": "tiny", "prompt": "' + b"x" * num_bytes + b'"}'
    connection = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    try:
        connection.request(
            "POST",
            "/v1/completions",
            (payload[i : i + (1 << 20)] for i in range(0, len(payload), 1 << 20)),
            {"Content-Type": "application/json"},
            encode_chunked=True,
        )
        return connection.getresponse().status
    except (BrokenPipeError, ConnectionResetError):
        return None
    finally:
        connection.close()


def test_a_50_mb_body_is_refused_with_413_and_health_keeps_answering(live):
    """Was: no body limit; a 50 MB prompt stalled /health for 4.6 s (tokenized on the event loop)."""
    stop, latencies = threading.Event(), []
    watcher = threading.Thread(target=lambda: latencies.extend(live.health_latencies_s(stop)))
    watcher.start()
    status, body = _declared_upload(live, 50 << 20)
    chunked = _chunked_upload(live, 50 << 20)
    time.sleep(0.3)
    stop.set()
    watcher.join()
    assert (
        status == 413
        and body["error"]["code"] == "request_too_large"
        and "33,554,432 bytes" in body["error"]["message"]
    )
    assert chunked in (413, None)
    assert len(latencies) > 3 and max(latencies) < 0.5, (
        f"/health took {max(latencies):.2f} s during the uploads"
    )
    assert live.post("/v1/completions", {"model": MODEL, "prompt": "still here", "max_tokens": 1})[0] == 200


def test_a_non_stream_client_that_leaves_frees_the_engine(live):
    """Was: ``curl -m 2`` on a long completion left the engine generating, counted as a success."""
    succeeded = live.metric("request_success_total")
    live.send_and_leave(
        "/v1/completions", {"model": MODEL, "prompt": "long", "max_tokens": 8000, "ignore_eos": True}, 0.5
    )
    start = time.perf_counter()
    status, _ = live.post("/v1/completions", {"model": MODEL, "prompt": "next", "max_tokens": 1})
    assert status == 200 and time.perf_counter() - start < 1.5
    assert live.metric("request_success_total") == succeeded + 1
    assert live.metric("num_requests_running") == 0


def test_a_request_abandoned_while_queued_never_runs(live):
    """Was: a queued request whose client had left ran when its turn came."""
    succeeded = live.metric("request_success_total")
    running = threading.Thread(
        target=live.send_and_leave,
        args=(
            "/v1/completions",
            {"model": MODEL, "prompt": "holds the engine", "max_tokens": 8000, "ignore_eos": True},
            1.5,
        ),
    )
    running.start()
    time.sleep(0.3)
    live.send_and_leave(
        "/v1/completions", {"model": MODEL, "prompt": "queued", "max_tokens": 50, "ignore_eos": True}, 0.3
    )
    running.join()
    assert live.post("/v1/completions", {"model": MODEL, "prompt": "next", "max_tokens": 1})[0] == 200
    assert live.metric("request_success_total") == succeeded + 1  # only "next"


BIG = 2**63
CLIENT_MISTAKES = [  # (raw JSON body, param); each was a 500, a silent coercion or an unnamed field
    (f'{{"model": "tiny", "prompt": [{BIG}], "max_tokens": 1}}', "prompt[0]"),
    (f'{{"model": "tiny", "prompt": "hi", "seed": {2**70}, "temperature": 1}}', "seed"),
    ('{"model": "tiny", "prompt": "hi", "cache_salt": "\\ud800"}', "cache_salt"),
    ('{"model": "tiny", "prompt": "hi", "cache_salt": ""}', "cache_salt"),
    ('{"model": "tiny", "prompt": "\\udfff x"}', "prompt"),
    ('{"model": "tiny", "messages": [{"role": "user", "content": "\\ud83d"}]}', "messages"),
    ('{"model": "tiny", "prompt": "hi", "max_tokens": true}', "max_tokens"),
    ('{"model": "tiny", "prompt": "hi", "max_tokens": "4"}', "max_tokens"),
    ('{"model": "tiny", "prompt": "hi", "stream": "yes"}', "stream"),
    ('{"model": "tiny", "prompt": "hi", "temperature": Infinity}', "temperature"),
    ('{"model": "tiny", "prompt": "hi", "temperature": -1}', "temperature"),
    ('{"model": "tiny", "prompt": "hi", "top_p": 0}', "top_p"),
    (
        '{"model": "tiny", "prompt": "hi", "stream_options": {"include_usage": 1}}',
        "stream_options.include_usage",
    ),
    ('{"model": "tiny", "prompt": {"a": 1}}', "prompt"),
    ('{"model": "tiny", "prompt": "hi", "logprobs": 2}', "logprobs"),
    (
        '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}',
        "tools",
    ),
    (
        '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], '
        '"response_format": {"type": "json_object"}}',
        "response_format",
    ),
    (
        '{"model": "tiny", "messages": [{"role": "user"}], "max_completion_tokens": 0}',
        "max_completion_tokens",
    ),
    (json.dumps({"model": "tiny", "prompt": [5] * 8200, "max_tokens": 1}), "prompt"),
    (json.dumps({"model": "tiny", "prompt": [5] * 8000, "max_tokens": 500}), "max_tokens"),
    ("{}", "model"),
    ("", None),
    ("[1, 2]", None),
    ("[" * 100_000 + "]" * 100_000, None),
]


@pytest.mark.parametrize("payload,param", CLIENT_MISTAKES, ids=[str(i) for i in range(len(CLIENT_MISTAKES))])
def test_every_client_mistake_is_a_400_naming_its_field(live, payload, param):
    path = "/v1/chat/completions" if '"messages"' in payload else "/v1/completions"
    status, body = live.post_raw(path, payload.encode())
    assert status == 400, body
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["param"] == param
    assert body["error"]["type"] == "invalid_request_error" and "Traceback" not in body["error"]["message"]
    if param is None:
        assert "body" in body["error"]["message"]
    assert live.post("/v1/completions", {"model": MODEL, "prompt": "still here", "max_tokens": 1})[0] == 200
