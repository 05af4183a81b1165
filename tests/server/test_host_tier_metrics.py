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
