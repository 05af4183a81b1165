"""A large but allowed body (many empty messages, under the 32 MiB limit) never freezes the
event loop: it is parsed off the loop and refused once it holds more JSON objects than the context
has tokens, while ``/health`` keeps answering within 1 s (it stalled 8.5 s on a 28.3 MB body)."""

import json
import threading
import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

MODEL = "tiny"
NUM_MESSAGES = 300_000  # ~9.9 MB: stalled /health for seconds before; a third of a 28 MB body


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_many_empty_messages_never_stall_health(live, path):
    payload = json.dumps(
        {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": ""}] * NUM_MESSAGES}
    ).encode()
    stop, latencies = threading.Event(), []
    watcher = threading.Thread(target=lambda: latencies.extend(live.health_latencies_s(stop)))
    watcher.start()
    time.sleep(0.2)
    status, answer = live.post_raw(path, payload)
    time.sleep(0.2)
    stop.set()
    watcher.join()
    assert len(latencies) >= 5 and max(latencies) < 1.0, f"/health took {max(latencies):.2f} s"
    assert status == 400 and "8,256 JSON objects" in answer["error"]["message"], answer
    if path == "/v1/messages":  # Anthropic's shape: no param or code, the field first in the message
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["message"].startswith(
            "messages"
        )
    else:
        assert answer["error"]["code"] == "too_many_objects" and answer["error"]["param"] == "messages"


def test_a_conversation_that_fits_is_still_served(live):
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "ok"} for i in range(501)]
    status, answer = live.post(
        "/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "messages": messages}
    )
    assert status == 200 and answer["usage"]["prompt_tokens"] > 501
