"""A live ``kvbench serve`` app on a free loopback port, over a tiny random model (fast to build)."""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import uvicorn

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.commands.serve import bind_socket
from kvbench.engine.engine import EngineConfig, HFEngine, SamplingParams
from kvbench.engine.model import default_llama_config, random_model
from kvbench.server.app import create_app
from kvbench.server.service import EngineService
from kvbench.workloads.tokenizer import load_tokenizer

MODEL = "tiny"


@pytest.fixture(scope="session")
def tiny_loaded():
    """cl100k's vocabulary (the tokenizer's ids must be valid), everything else tiny."""
    return random_model(default_llama_config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=16))


class LiveServer:
    """uvicorn in a background thread; ``url`` is the API root with /v1."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        sock = bind_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.server = uvicorn.Server(uvicorn.Config(create_app(service), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def post(self, path: str, body, timeout: float = 60) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url.removesuffix("/v1") + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(self.url.removesuffix("/v1") + path, timeout=30) as response:
            return response.status, response.read().decode()


def tiny_service(loaded, capacity_blocks: int = 4096) -> EngineService:
    """The server's service over ``loaded`` with a hash cache of ``capacity_blocks``."""
    engine = HFEngine(loaded, EngineConfig(cache=CacheConfig(capacity_blocks=capacity_blocks)))
    return EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer())


@pytest.fixture
def service(tiny_loaded):
    """A fresh service (64-block cache) over the tiny model, no HTTP."""
    return tiny_service(tiny_loaded, capacity_blocks=64)


@pytest.fixture(scope="module")
def live(tiny_loaded):
    service = tiny_service(tiny_loaded)
    server = LiveServer(service)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def paged_live(tiny_loaded):
    """A live server over the paged engine (``--engine paged``): ``(server, engine)``."""
    from kvbench.engine.paged.engine import PagedConfig, PagedEngine

    engine = PagedEngine(tiny_loaded, PagedConfig(CacheConfig(capacity_blocks=512)))
    server = LiveServer(EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer()))
    yield server, engine
    server.stop()
