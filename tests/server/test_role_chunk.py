"""A chat stream's role chunk goes out with the first token (as vLLM sends it), never
before the prefill: a stream queued behind another request sends nothing until its turn, so a
client's time to first byte of the body is its time to first token. Copy and paged engines."""

import http.client
import json
import threading
import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

MODEL = "tiny"


def _timed_events(server, path: str, body: dict) -> list[tuple[float, dict]]:
    """``(seconds since the request was sent, event)`` of every SSE data event but ``[DONE]``."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    start = time.perf_counter()
    connection.request(
        "POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    events = []
    while line := response.readline():
        if line.startswith(b"data: {"):
            events.append((time.perf_counter() - start, json.loads(line[6:])))
    connection.close()
    return events


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_the_first_chunk_waits_for_the_first_token(each_engine, path):
    server, _ = each_engine
    holder = threading.Thread(
        target=server.post,
        args=(
            "/v1/completions",
            {"model": MODEL, "prompt": "holds the engine", "max_tokens": 150, "ignore_eos": True},
        ),
    )
    started = time.perf_counter()
    holder.start()
    time.sleep(0.3)  # the holder runs; the stream below waits behind it
    body = {"model": MODEL, "max_tokens": 3, "ignore_eos": True}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})
    events = _timed_events(server, path, body)
    holder.join()
    held_s = time.perf_counter() - started
    first_s, first = events[0]
    if "chat" in path:
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert events[1][0] - first_s < 0.5  # the first token follows at once
    assert first_s > 0.5 * (held_s - 0.3), (
        f"first chunk after {first_s:.2f} s while the engine was held {held_s:.2f} s"
    )
