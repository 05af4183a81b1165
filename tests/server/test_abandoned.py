"""A non-streamed request whose client leaves, running or still queued, on every
route and every engine (copy, paged hash, paged radix): no exception inside the server, the request
counted as aborted (never as a success), its blocks freed, the engine free for the next request."""

import gc
import logging
import threading
import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

MODEL = "tiny"
LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 140  # ~1,400 tokens: a long prefill


class _Errors(logging.Handler):
    """ERROR records of uvicorn ("Exception in ASGI application") and asyncio ("never retrieved")."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(
            f"{record.name}: {record.getMessage()} {record.exc_info and record.exc_info[1]!r}"
        )


@pytest.fixture
def server_errors():
    handler = _Errors()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "asyncio")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler.messages
    gc.collect()  # a never-retrieved future's error is logged when it is collected
    for logger in loggers:
        logger.removeHandler(handler)


def _no_pinned_blocks(engine) -> bool:
    if hasattr(engine, "scheduler"):
        return not engine.scheduler.has_work and engine.scheduler.pool.num_used_blocks == 0
    return engine.cache.num_cached_blocks == engine.cache.num_evictable_blocks


def _wait_for_no_pinned_blocks(engine, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not _no_pinned_blocks(engine):
        assert time.monotonic() < deadline, "blocks stayed pinned after the client left"
        time.sleep(0.05)


ROUTES = {  # a long non-streamed request per route
    "/v1/completions": {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 4000, "ignore_eos": True},
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": 4000,
        "ignore_eos": True,
    },
    "/v1/messages": {
        "model": MODEL,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": 4000,
    },
}


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_running_request_whose_client_leaves_is_aborted(each_engine, server_errors, path):
    """Was (30.1): ``InvalidStateError: Result is not set`` in the ASGI app and the request counted
    nowhere; (32.4) ``/v1/messages`` kept generating after its client left."""
    server, engine = each_engine
    succeeded, aborted = server.metric("request_success_total"), server.metric("request_abort_total")
    server.send_and_leave(path, ROUTES[path], leave_after_s=1.0)
    server.wait_for_metric("request_abort_total", aborted + 1)
    _wait_for_no_pinned_blocks(engine)
    start = time.perf_counter()
    status, _ = server.post("/v1/completions", {"model": MODEL, "prompt": "next", "max_tokens": 1})
    assert status == 200 and time.perf_counter() - start < 10
    assert server.metric("request_success_total") == succeeded + 1  # only "next"
    assert server.metric("request_abort_total") == aborted + 1
    assert server.metric("num_requests_running") == 0
    gc.collect()
    assert server_errors == []


def test_a_queued_request_whose_client_leaves_never_runs(each_engine, server_errors):
    """Was (30.1): an abandoned queued chat request raised in the server; on the paged engine it was
    prefilled when its turn came (its blocks then cached)."""
    server, engine = each_engine
    succeeded, aborted = server.metric("request_success_total"), server.metric("request_abort_total")
    queued_prompt = "a queued question that never runs " * 20  # 140 tokens: several blocks
    holder = threading.Thread(
        target=server.send_and_leave, args=("/v1/completions", ROUTES["/v1/completions"], 2.5)
    )
    holder.start()
    time.sleep(0.8)  # the holder runs; the next request waits behind it
    server.send_and_leave(
        "/v1/chat/completions",
        {
            "model": MODEL,
            "max_tokens": 50,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": queued_prompt}],
        },
        0.5,
    )
    holder.join()
    server.wait_for_metric("request_abort_total", aborted + 2)
    _wait_for_no_pinned_blocks(engine)
    status, body = server.post(
        "/v1/chat/completions",
        {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": queued_prompt}]},
    )
    assert status == 200 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # never prefilled
    assert server.metric("request_success_total") == succeeded + 1
    gc.collect()
    assert server_errors == []
