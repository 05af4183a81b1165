"""``kvbench serve --engine paged --host-tier``: host-tier hits at /metrics under vLLM's connector names,
equal to the per-request usage the real openai client reads."""

import numpy as np
import openai
import pytest
from live_server import MODEL, LiveServer

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import SamplingParams
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.server.service import EngineService
from kvbench.workloads.tokenizer import load_tokenizer

pytestmark = [pytest.mark.engine, pytest.mark.server]


def counter(text, name):
    line = next(line for line in text.splitlines() if line.startswith(f"kvbench:{name}_total"))
    return float(line.rsplit(" ", 1)[1])


def test_host_tier_hits_are_counted_at_metrics_as_the_usage_reports_them(tiny_loaded):
    engine = PagedEngine(
        tiny_loaded, PagedConfig(CacheConfig(capacity_blocks=6, block_size=16), host_tier_blocks=32)
    )
    server = LiveServer(EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer()))
    try:
        rng = np.random.default_rng(0)
        prefixes = [rng.integers(3, 900, 64).tolist() for _ in range(3)]  # three 4-block system prompts
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        usages = [
            client.completions.create(model=MODEL, prompt=prefixes[i % 3] + [7, 8, 9], max_tokens=1).usage
            for i in range(9)
        ]
        text = server.get("/metrics")[1]
    finally:
        server.stop()
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    assert cached == 6 * 64  # the pool keeps none of them; the host tier all of the second and third rounds
    assert counter(text, "external_prefix_cache_hits") == cached == counter(text, "prefix_cache_hits")
    assert counter(text, "external_prefix_cache_queries") == sum(u.prompt_tokens for u in usages)


def test_without_a_host_tier_there_are_no_external_counters(paged_live):
    server, _ = paged_live
    assert "external_prefix_cache" not in server.get("/metrics")[1]


def test_a_host_tier_hit_whose_client_leaves_counts_in_neither_hit_counter(tiny_loaded):
    """``--cache-size 40 --host-tier 64``: a prompt pushed out of the pool into the tier, then streamed
    again (500 tokens) and left after two. External (host) hits stay a subset of prefix-cache hits and the
    external queries equal the prefix-cache queries, before and after a later finished host hit."""
    engine = PagedEngine(
        tiny_loaded, PagedConfig(CacheConfig(capacity_blocks=40, block_size=16), host_tier_blocks=64)
    )
    server = LiveServer(EngineService(InProcessBackend(engine, SamplingParams(), MODEL), load_tokenizer()))
    try:
        rng = np.random.default_rng(1)
        prompt = rng.integers(3, 900, 5 * 16 + 3).tolist()  # 5 whole blocks, then 3 tokens
        server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
        for _ in range(3):  # three 15-block prompts push it out of the 40-block pool, into the tier
            other = rng.integers(3, 900, 14 * 16 + 3).tolist()
            server.post("/v1/completions", {"model": MODEL, "prompt": other, "max_tokens": 1})
        status, events = server.leave_stream(
            {"model": MODEL, "prompt": prompt, "max_tokens": 500, "ignore_eos": True}, num_events=2
        )
        assert status == 200 and len(events) == 2  # the prefill (with its host-tier load) happened
        server.wait_for_metric("request_abort_total", 1)
        left = server.get("/metrics")[1]
        status, again = server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
        finished = server.get("/metrics")[1]
    finally:
        server.stop()
    for text in (left, finished):
        hits, external_hits = counter(text, "prefix_cache_hits"), counter(text, "external_prefix_cache_hits")
        assert external_hits <= hits, text  # was 80 external hits against 0
        assert counter(text, "external_prefix_cache_queries") == counter(text, "prefix_cache_queries"), text
    assert counter(left, "external_prefix_cache_hits") == 0  # the left request counts nowhere
    host_hit = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert status == 200 and host_hit == 5 * 16  # still in the tier (or back in the pool): all 5 blocks
    assert counter(finished, "prefix_cache_hits") == host_hit
