"""``kvbench serve``: a request body that stops arriving no longer holds its connection for ever.

Headers promising ``Content-Length: 100000`` and then 9 bytes: at ``--max-connections 8`` eight such
clients kept ``/health`` at 503 (each counted as busy), and with the default cap they stayed open
until the server stopped. Now a stalled body counts as a slow client at the cap, and is closed once
no byte of it came for ``--body-timeout`` seconds; a body that keeps coming is read whole."""

import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from readiness import wait_until
from serve_process import ServeProcess

BODY_TIMEOUT_S = 2.0
STALLED_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100000\r\n\r\n"
)


@pytest.fixture(scope="module")
def capped():
    server = ServeProcess("--max-connections", "8", "--body-timeout", str(BODY_TIMEOUT_S))
    server.url  # noqa: B018 - waits until it answers
    yield server
    server.stop()


def _address(server) -> tuple[str, int]:
    parts = urlsplit(server.url)
    return parts.hostname, parts.port


def _stalled(server) -> socket.socket:
    """A connection that sent a head, 9 bytes of its promised 100,000-byte body, and nothing since."""
    sock = socket.create_connection(_address(server), timeout=30)
    sock.sendall(STALLED_HEAD + b'{"model":')
    return sock


def _health(server) -> int:
    try:
        with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_stalled_bodies_at_the_cap_leave_health_answering(capped):
    stalled = [_stalled(capped) for _ in range(8)]
    try:
        time.sleep(0.5)  # every one of them is open and has sent its 9 bytes
        assert [_health(capped) for _ in range(3)] == [200, 200, 200]
    finally:
        for sock in stalled:
            sock.close()


def test_a_stalled_body_is_closed_after_the_body_timeout(capped):
    sock = _stalled(capped)
    start_s = time.monotonic()
    with sock:
        sock.settimeout(60)
        try:
            received = sock.recv(1000)
        except ConnectionResetError:
            received = b""
    closed_after_s = time.monotonic() - start_s
    assert received == b"" and BODY_TIMEOUT_S * 0.9 < closed_after_s < BODY_TIMEOUT_S + 10
    wait_until(lambda: "request body stalled for 2 s (--body-timeout" in capped.log(), "the log line")


def test_a_slow_body_that_keeps_coming_is_read_whole(capped):
    """Longer in all than the timeout, never silent that long: answered (404 names the unknown model)."""
    body = b'{"model": "no-such-model", "prompt": "hi"}'
    head = STALLED_HEAD.replace(b"100000", str(len(body)).encode())
    with socket.create_connection(_address(capped), timeout=60) as sock:
        sock.sendall(head)
        for start in range(0, len(body), 8):
            time.sleep(BODY_TIMEOUT_S / 3)
            sock.sendall(body[start : start + 8])
        answer = sock.recv(1000)
    assert answer.startswith(b"HTTP/1.1 404"), answer
