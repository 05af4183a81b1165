"""``kvbench serve`` stops within seconds on SIGTERM or SIGINT while long streams run: each stream ends
with one error event naming the stop and ``[DONE]``, and the server says so in one line."""

import http.client
import json
import signal
import threading
import time
from urllib.parse import urlsplit

import pytest
from readiness import wait_until
from serve_process import ServeProcess

NUM_STREAMS = 3
STOP_LIMIT_S = 30.0  # one token or engine step plus uvicorn's close: 2-11 s at load 10 on 2 cores;
# before, the streams ran on (4,000 tokens: minutes)


def _model_name(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/models", timeout=30) as response:
        return json.load(response)["data"][0]["id"]


@pytest.mark.parametrize(
    "signal_number, engine",
    [(signal.SIGTERM, "copy"), (signal.SIGINT, "copy"), (signal.SIGTERM, "paged")],
    ids=["sigterm-copy", "sigint-copy", "sigterm-paged"],
)
def test_long_streams_end_cleanly_within_seconds_of_a_stop_signal(signal_number, engine):
    server = ServeProcess("--engine", engine)
    try:
        url = server.url
        model = _model_name(url)
        streams = [[] for _ in range(NUM_STREAMS)]
        threads = []
        for events in streams:
            thread = threading.Thread(target=_stream, args=(url, events, model), daemon=True)
            thread.start()
            threads.append(thread)
        wait_until(  # the copy engine runs them one at a time, in the order they arrived
            lambda: any(len(events) >= 3 for events in streams),
            "a stream's first tokens",
            ended=lambda: None if any(t.is_alive() for t in threads) else f"streams ended: {streams}",
            limit_s=180,
        )
        server.process.send_signal(signal_number)
        start_s = time.monotonic()
        server.process.wait(timeout=60)
        stopped_s = time.monotonic() - start_s
        for thread in threads:
            thread.join(timeout=30)
    finally:
        server.stop()
    name = signal.Signals(signal_number).name
    assert stopped_s < STOP_LIMIT_S, (stopped_s, server.log())
    assert server.process.returncode == 128 + signal_number, server.log()
    assert f"kvbench serve: {name}: stopping, ending {NUM_STREAMS} requests in flight" in server.log()
    for events in streams:
        assert events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert f"the server is stopping ({name})" in error["message"], error
        assert len(events) < 4000


def _stream(url: str, events: list[str], model: str) -> None:
    """One ``max_tokens`` 4,000 stream; every SSE data line appended to ``events`` as it comes."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = {"model": model, "prompt": "tell me a long story", "max_tokens": 4000, "stream": True}
    body["ignore_eos"] = True
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        for line in connection.getresponse():
            if line.startswith(b"data: "):
                events.append(line[6:].decode().strip())
    except OSError as exc:
        events.append(f"connection error: {exc}")
    finally:
        connection.close()
