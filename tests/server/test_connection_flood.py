"""A slow-headers flood (many connections dribbling their request heads) on loopback never
exhausts descriptors: the server holds at most its cap, closes slow clients after the header timeout,
keeps answering a normal client (``/health`` under 1 s), logs each condition once, and its open
descriptors return to their baseline afterwards. Bounded: 120 connections for about 4 s."""

import logging
import os
import socket
import threading
import time

import pytest
from live_server import LiveServer, tiny_service

from kvbench.server.connections import ConnectionLimits

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

MODEL = "tiny"
CAP = 32
NUM_FLOOD = 120
FLOOD_S = 4.0


def _num_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _closed_by_server(sock: socket.socket) -> bool:
    """The server closed ``sock`` (EOF or a reset); a 503 it wrote first is read and dropped."""
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _flood(port: int, stop: threading.Event, closed: list) -> None:
    """Open ``NUM_FLOOD`` connections that send half a request head, then one more byte every 0.3 s."""
    sockets = []
    for _ in range(NUM_FLOOD):  # 100 new connections a second, as a slowloris ramps up
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        sock.setblocking(False)
        sockets.append(sock)
        time.sleep(0.01)
    while not stop.is_set():
        for sock in list(sockets):
            try:
                gone = _closed_by_server(sock) or not sock.send(b"a")
            except OSError:
                gone = True
            if gone:
                closed.append(sock)
                sockets.remove(sock)
                sock.close()
        time.sleep(0.3)
    closed.extend(sock for sock in sockets if _closed_by_server(sock))
    for sock in sockets:
        sock.close()


@pytest.fixture
def limited(tiny_loaded):
    server = LiveServer(
        tiny_service(tiny_loaded), limits=ConnectionLimits(max_connections=CAP, header_timeout_s=1.5)
    )
    yield server
    server.stop()


def test_a_slow_headers_flood_is_capped_and_the_server_keeps_answering(limited):
    warnings = _Warnings()
    logging.getLogger("uvicorn.error").addHandler(warnings)
    assert limited.get("/health")[0] == 200
    baseline = _num_descriptors()
    stop, closed_by_server, latencies, peak = threading.Event(), [], [], [0]
    flooder = threading.Thread(target=_flood, args=(limited.port, stop, closed_by_server), daemon=True)
    flooder.start()
    try:
        deadline = time.monotonic() + FLOOD_S
        while time.monotonic() < deadline:
            peak[0] = max(peak[0], len(limited.server.server_state.connections))
            start = time.perf_counter()
            assert limited.get("/health")[0] == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.05)
        status, body = limited.post(
            "/v1/completions", {"model": MODEL, "prompt": "still served", "max_tokens": 2}
        )
    finally:
        stop.set()
        flooder.join(timeout=30)
        logging.getLogger("uvicorn.error").removeHandler(warnings)
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    assert max(latencies) < 1.0, f"/health took {max(latencies):.2f} s during the flood"
    assert peak[0] <= CAP + 1, f"{peak[0]} connections open at once (cap {CAP}; +1: one being refused)"
    assert len(closed_by_server) >= NUM_FLOOD - CAP  # evicted at the cap or closed at the header timeout
    assert 1 <= len(warnings.messages) <= 3, warnings.messages  # one line per condition, not per connection
    deadline = time.monotonic() + 30
    while _num_descriptors() > baseline:
        assert time.monotonic() < deadline, (
            f"{_num_descriptors()} descriptors open, {baseline} before the flood"
        )
        time.sleep(0.1)


def test_a_cap_above_the_open_file_limit_is_refused_in_one_line(kvbench):
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    code, _, stderr = kvbench("serve", "--port", "0", "--max-connections", str(soft + 1))
    assert code == 2 and "--max-connections" in stderr and "ulimit -n" in stderr
    assert len(stderr.strip().splitlines()) == 1
