"""``kvbench serve --engine paged`` over the tiny model: 16 concurrent clients batched for real, the
/metrics counters equal to the per-request usage, a vanished client freeing its blocks."""

import threading
import urllib.request

import openai
from live_server import wait_until_idle

from kvbench.backends.openai.metrics import parse_prefix_cache_counters

MODEL = "tiny"


def test_sixteen_concurrent_clients_are_batched_and_metrics_reconcile(paged_live):
    server, engine = paged_live
    batch_sizes = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        batch = schedule()
        batch_sizes.append(len(batch.items))
        return batch

    engine.scheduler.schedule = recording_schedule
    before = parse_prefix_cache_counters(server.get("/metrics")[1])
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    usages = concurrent_chat_usages(
        client, MODEL, "You are a helpful assistant. " * 12, 16, max_tokens=8, timeout_s=120
    )
    engine.scheduler.schedule = schedule
    after = parse_prefix_cache_counters(server.get("/metrics")[1])
    assert after.queries_tokens - before.queries_tokens == sum(u.prompt_tokens for u in usages)
    assert after.hits_tokens - before.hits_tokens == sum(
        u.prompt_tokens_details.cached_tokens for u in usages
    )
    assert sum(u.prompt_tokens_details.cached_tokens for u in usages) > 0
    assert all(u.completion_tokens == 8 for u in usages)
    assert max(batch_sizes) > 1  # requests really ran side by side
    wait_until_idle(engine)
    engine.check_invariants()
    assert engine.scheduler.pool.num_used_blocks == 0


def test_a_client_that_leaves_mid_stream_frees_its_blocks(paged_live):
    server, engine = paged_live
    succeeded = server.service.counters.num_succeeded
    body = {
        "model": MODEL,
        "prompt": "a long story " * 20,
        "max_tokens": 900,
        "stream": True,
        "ignore_eos": True,
    }
    status, events = server.leave_stream(body, 2)  # the client leaves after two tokens
    assert status == 200 and len(events) == 2
    wait_until_idle(engine)
    engine.check_invariants()
    assert engine.scheduler.pool.num_used_blocks == 0
    assert server.service.counters.num_succeeded == succeeded  # stopped, not finished


def test_kvbench_serve_paged_radix_under_concurrent_openai_clients(paged_radix_server):
    """The real command (default model) with the radix tree over the pool: 8 concurrent chat clients
    sharing a system prompt; /metrics grows by exactly the summed usage, and the prompt is shared."""
    url = paged_radix_server.url

    def counters():
        with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30) as response:
            return parse_prefix_cache_counters(response.read().decode())

    before = counters()
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    usages = concurrent_chat_usages(
        client, model, "You are a helpful assistant who answers briefly. " * 8, 8, max_tokens=3, timeout_s=300
    )
    after = counters()
    assert after.queries_tokens - before.queries_tokens == sum(u.prompt_tokens for u in usages)
    assert after.hits_tokens - before.hits_tokens == sum(
        u.prompt_tokens_details.cached_tokens for u in usages
    )
    # the system prompt computed once
    assert sum(u.prompt_tokens_details.cached_tokens > 0 for u in usages) >= 7


def concurrent_chat_usages(
    client, model: str, system: str, count: int, max_tokens: int, timeout_s: float
) -> list:
    """``count`` chat requests at once from threads, one shared ``system`` prompt and a distinct user
    message each; the usages of all of them (asserts that none failed)."""
    usages, errors = [], []

    def one(i):
        try:
            response = client.chat.completions.create(
                model=model,
                max_tokens=max_tokens,
                extra_body={"ignore_eos": True},
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i}"},
                ],
            )
            usages.append(response.usage)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    assert errors == [] and len(usages) == count
    return usages
