"""A request that received nothing is sent again (a reused keep-alive connection
the server closed; a dead replica), counted in ``num_retries``; a dead replica is ejected."""

import asyncio

import pytest
from fake_servers import FakeServer
from openai_calls import TOKENIZER, chat_request, serve

from kvbench.backends.routed import EJECT_AFTER_FAILURES, RoutedBackend
from kvbench.request import NOTHING_SENT, Status

pytestmark = [pytest.mark.server]


@pytest.fixture
def closing_server():
    server = FakeServer("close_reused")
    yield server
    server.stop()


@pytest.mark.parametrize("client", ["lean", "sdk"])
def test_a_reused_connection_closed_unanswered_is_retried_once_and_counted(closing_server, client):
    first, second = serve(closing_server.url, [chat_request(0), chat_request(1)], client)
    assert (first.status, first.num_retries) == (Status.OK, 0)
    assert (second.status, second.num_retries, second.output_tokens) == (Status.OK, 1, 2)
    assert len(closing_server.bodies) == 3  # the second request went out twice: once lost, once answered


def test_a_refused_connection_is_nothing_sent_and_not_retried_on_the_same_endpoint(refused_url):
    (record,) = serve(refused_url, [chat_request(0)], "lean")
    assert record.error.startswith(NOTHING_SENT) and record.nothing_sent and record.num_retries == 0


def test_a_dead_replica_is_ejected_and_its_requests_go_elsewhere(refused_url):
    from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig

    live = FakeServer(
        "script",
        [
            {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
            }
        ],
    )
    try:
        backends = [
            OpenAIBackend(OpenAIConfig(url, "m", timeout_s=10.0), TOKENIZER)
            for url in (live.url, refused_url)
        ]
        routed = RoutedBackend(backends, "round-robin")

        async def go():
            async with routed:
                return [await routed.serve(chat_request(i)) for i in range(12)]

        records = asyncio.run(go())
    finally:
        live.stop()
    assert [r.status for r in records] == [Status.OK] * 12 and {r.replica for r in records} == {0}
    assert sum(r.num_retries for r in records) == EJECT_AFTER_FAILURES  # then replica 1 gets no traffic
    assert routed.ejected == {1} and len(live.bodies) == 12
    assert routed.events[0].startswith("replica 1 ejected after 3 consecutive connection failures")
