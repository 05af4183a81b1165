"""A live ``kvbench serve`` app on a free loopback port, over the tiny random model (``tiny_loaded``,
tests/conftest.py: fast to build)."""

import pytest
from live_server import LiveServer, tiny_service

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import SamplingParams
from kvbench.server.service import EngineService
from kvbench.workloads.tokenizer import load_tokenizer

MODEL = "tiny"


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


@pytest.fixture(scope="module", params=["hash", "radix"])
def paged_live(tiny_loaded, request):
    """A live server over the paged engine (``--engine paged``), its pool keyed by block hash or as a
    radix tree (``--cache-kind radix``): ``(server, engine)``."""
    from kvbench.engine.paged.engine import PagedConfig, PagedEngine

    engine = PagedEngine(tiny_loaded, PagedConfig(CacheConfig(capacity_blocks=512, kind=request.param)))
    server = LiveServer(EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer()))
    yield server, engine
    server.stop()


@pytest.fixture(scope="module", params=["copy", "paged-hash", "paged-radix"])
def each_engine(tiny_loaded, request):
    """A live server on each engine: copy, paged with a hash or a radix pool. The paged engine runs one
    sequence at a time (``max_num_seqs=1``), so a second request waits in its scheduler as it would in
    the copy engine's queue: ``(server, engine)``."""
    from kvbench.engine.paged.engine import PagedConfig, PagedEngine

    if request.param == "copy":
        service = tiny_service(tiny_loaded)
    else:
        kind = request.param.removeprefix("paged-")
        engine = PagedEngine(
            tiny_loaded, PagedConfig(CacheConfig(capacity_blocks=1024, kind=kind), max_num_seqs=1)
        )
        service = EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer())
    server = LiveServer(service)
    yield server, service.engine
    server.stop()
