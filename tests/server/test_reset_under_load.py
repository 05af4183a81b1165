"""``POST /reset_prefix_cache`` while clients stream answers the same on every engine: a
200 once the requests submitted before it have finished (the paged engine answered 500,
``CacheBusyError``), with every stream complete and the cache empty afterwards."""

import threading
import time

import openai
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

MODEL = "tiny"
NUM_CLIENTS = 6
NUM_RESETS = 4


def _stream_usages(server, prompt: str, usages: list, errors: list) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    try:
        stream = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        usages.extend(chunk.usage for chunk in stream if chunk.usage is not None)
    except Exception as exc:  # noqa: BLE001 - the test reports every client's failure
        errors.append(repr(exc))


def test_reset_under_streaming_load_is_a_200_on_every_engine(each_engine):
    server, engine = each_engine
    prompt = "a shared system prompt for the reset test " * 8
    usages, errors = [], []
    clients = [
        threading.Thread(target=_stream_usages, args=(server, prompt, usages, errors))
        for _ in range(NUM_CLIENTS)
    ]
    for client in clients:
        client.start()
    time.sleep(0.5)
    answers = []
    for _ in range(NUM_RESETS):
        answers.append(server.post("/reset_prefix_cache", {}))
        time.sleep(0.1)
    for client in clients:
        client.join(timeout=180)
    assert answers == [(200, {"status": "ok", "cache_enabled": True})] * NUM_RESETS
    assert errors == [] and len(usages) == NUM_CLIENTS and all(u.completion_tokens == 40 for u in usages)
    assert server.post("/reset_prefix_cache", {}) == (200, {"status": "ok", "cache_enabled": True})
    status, body = server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    # the reset emptied it
    assert status == 200 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_reset_waits_for_the_requests_before_it_and_holds_the_ones_after(each_engine):
    """The copy engine's FIFO lock, now on both engines: the reset runs once the request sent before
    it has finished (and cached its prompt), and one sent after it starts only once the reset is done,
    so it finds nothing cached."""
    server, engine = each_engine
    prompt = "the barrier holds for prompts sent after the reset " * 6
    order, lock = [], threading.Lock()

    def send(name: str, body: dict) -> None:
        status, answer = server.post("/v1/completions" if "prompt" in body else "/reset_prefix_cache", body)
        with lock:
            order.append(
                (name, status, answer.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens"))
            )

    before = threading.Thread(
        target=send,
        args=("before", {"model": MODEL, "prompt": prompt, "max_tokens": 200, "ignore_eos": True}),
    )
    before.start()
    time.sleep(0.5)
    reset = threading.Thread(target=send, args=("reset", {}))
    reset.start()
    time.sleep(0.2)
    send("after", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    before.join()
    reset.join()
    assert [name for name, _, _ in order][2] == "after" and all(status == 200 for _, status, _ in order)
    assert order[2][2] == 0  # the reset ran after "before" cached its blocks and before "after" looked up
