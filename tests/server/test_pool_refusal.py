"""A request that can never fit the paged engine's KV pool is the client's mistake: a 400
naming ``max_tokens`` before any stream starts, streamed or not, on every route, through the real
openai and anthropic clients (streamed it was HTTP 200, then a ``server_error`` event)."""

import anthropic
import openai
import pytest
from live_server import LiveServer

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import SamplingParams
from kvbench.server.service import EngineService
from kvbench.workloads.tokenizer import load_tokenizer

pytestmark = [pytest.mark.engine, pytest.mark.server]

MODEL = "tiny"


@pytest.fixture(scope="module", params=["hash", "radix"])
def small_pool(tiny_loaded, request):
    """``--engine paged --cache-size 40``: 40 blocks of 16 tokens, 640 tokens per sequence at most."""
    from kvbench.engine.paged.engine import PagedConfig, PagedEngine

    engine = PagedEngine(tiny_loaded, PagedConfig(CacheConfig(capacity_blocks=40, kind=request.param)))
    server = LiveServer(EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer()))
    yield server
    server.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_openai_routes_refuse_what_the_pool_cannot_hold_naming_max_tokens(small_pool, stream):
    client = openai.OpenAI(base_url=small_pool.url, api_key="unused", max_retries=0, timeout=60)
    calls = [
        lambda: client.completions.create(model=MODEL, prompt="hello", max_tokens=700, stream=stream),
        lambda: client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=700, stream=stream
        ),
    ]
    for call in calls:
        with pytest.raises(openai.BadRequestError) as refused:
            response = call()
            list(response) if stream else None
        error = refused.value.body
        assert refused.value.status_code == 400 and error["param"] == "max_tokens"
        assert error["type"] == "invalid_request_error" and "the KV pool has 40" in error["message"]
    fits = client.completions.create(model=MODEL, prompt="hello", max_tokens=8, stream=False)
    assert fits.usage.completion_tokens >= 1


@pytest.mark.parametrize("stream", [False, True])
def test_messages_refuses_what_the_pool_cannot_hold_naming_max_tokens(small_pool, stream):
    client = anthropic.Anthropic(
        base_url=small_pool.url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=60
    )
    with pytest.raises(anthropic.BadRequestError) as refused:
        response = client.messages.create(
            model=MODEL, max_tokens=700, stream=stream, messages=[{"role": "user", "content": "hello"}]
        )
        list(response) if stream else None
    assert refused.value.status_code == 400 and refused.value.type == "invalid_request_error"
    assert refused.value.api_message.startswith("max_tokens")  # Anthropic's shape names the field first


def test_a_prompt_alone_too_big_for_the_pool_names_prompt(small_pool):
    status, body = small_pool.post("/v1/completions", {"model": MODEL, "prompt": [5] * 700, "max_tokens": 1})
    assert status == 400 and body["error"]["param"] == "prompt"
