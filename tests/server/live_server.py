"""A ``kvbench serve`` app in a background thread on a free loopback port (imported by conftest.py and
by tests that need a server of their own, e.g. with guards)."""

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import uvicorn
from readiness import thread_ended, wait_until

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.commands.serve import bind_socket
from kvbench.engine.engine import CopyConfig, HFEngine, SamplingParams
from kvbench.server.app import create_app
from kvbench.server.connections import ConnectionLimits, server_config
from kvbench.server.service import EngineService
from kvbench.workloads.tokenizer import load_tokenizer

MODEL = "tiny"


class LiveServer:
    """uvicorn in a background thread; ``url`` is the API root with /v1."""

    def __init__(
        self,
        service: EngineService,
        guards=None,
        limits: ConnectionLimits = ConnectionLimits(),
        replica_id: str | None = None,
    ) -> None:
        self.service = service
        sock = bind_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        app = create_app(service, guards, replica_id=replica_id)
        self.server = uvicorn.Server(server_config(app, "warning", limits))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, f"uvicorn on {self.url}", ended=thread_ended(self.thread))

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def post(self, path: str, body, timeout: float = 60) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url.removesuffix("/v1") + path,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def leave_stream(self, body: dict, num_events: int) -> tuple[int, list[dict]]:
        """POST a streamed ``body`` to /v1/completions, read ``num_events`` SSE data events, then close
        the connection (a client that leaves mid-stream); the status and the events read."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request(
            "POST",
            "/v1/completions",
            json.dumps({**body, "stream": True}),
            {"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        events = []
        while len(events) < num_events and (line := response.readline()):
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
        connection.close()
        return response.status, events

    def health_latencies_s(self, stop: threading.Event) -> list[float]:
        """Seconds each ``GET /health`` took, polled every 20 ms until ``stop`` is set."""
        latencies = []
        while not stop.is_set():
            start = time.perf_counter()
            assert self.get("/health")[0] == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.02)
        return latencies

    def post_raw(self, path: str, payload: bytes, content_type: str = "application/json") -> tuple[int, dict]:
        """``(status, parsed body)`` of one POST with exactly ``payload`` as its body (invalid JSON too)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request("POST", path, payload, {"Content-Type": content_type})
        response = connection.getresponse()
        body = response.read()
        connection.close()
        return response.status, json.loads(body) if body else {}

    def send_and_leave(self, path: str, body: dict, leave_after_s: float) -> None:
        """POST ``body`` to ``path`` on a raw socket and close it after ``leave_after_s`` without
        reading the answer (a client timeout, ``curl -m``)."""
        payload = json.dumps(body).encode()
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        time.sleep(leave_after_s)
        sock.close()

    def metric(self, name: str) -> float:
        """The value of ``kvbench:NAME`` at /metrics (its one sample)."""
        line = next(
            line for line in self.get("/metrics")[1].splitlines() if line.startswith(f"kvbench:{name}")
        )
        return float(line.split()[-1])

    def wait_for_metric(self, name: str, value: float, timeout_s: float = 60) -> None:
        """Poll /metrics until ``kvbench:NAME`` reaches ``value`` (AssertionError after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while (now := self.metric(name)) < value:
            assert time.monotonic() < deadline, f"kvbench:{name} stayed at {now}, expected {value}"
            time.sleep(0.05)

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(self.url.removesuffix("/v1") + path, timeout=30) as response:
            return response.status, response.read().decode()


def wait_until_idle(engine) -> None:
    """Wait until the paged ``engine``'s scheduler has no work left (requests finished or stopped)."""
    wait_until(lambda: not engine.scheduler.has_work, "the paged engine going idle")


def tiny_service(loaded, capacity_blocks: int = 4096) -> EngineService:
    """The server's service over ``loaded`` with a hash cache of ``capacity_blocks``."""
    engine = HFEngine(loaded, CopyConfig(cache=CacheConfig(capacity_blocks=capacity_blocks)))
    return EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer())
