"""Server-aware expectations: settings detected from ``/metrics`` text, the model they choose, and
the notes that say what was detected and what assumed."""

import numpy as np
import pytest

from kvbench.backends.openai.metrics import (
    ServerCacheSettings,
    detect_cache_settings,
    parse_prefix_cache_counters,
)
from kvbench.backends.openai.server_cache import resolve_server_cache, server_expectations
from kvbench.cache.base import CacheConfig
from kvbench.request import Request
from kvbench.server.metrics import ServerCounters, cache_config_labels, render_metrics
from kvbench.sim.predict import Unbounded
from kvbench.sim.vllm_pool import VllmPoolConfig

VLLM = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="1638",prefix_caching_hash_algo="sha256"} 1.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 40.0
"""  # noqa: E501
SGLANG = """\
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="qwen"} 1000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="qwen"} 300.0
sglang:cached_tokens_total{cache_source="host",model_name="qwen"} 50.0
"""


def test_block_size_pool_and_prefix_caching_come_from_vllm_cache_config_info():
    detected = detect_cache_settings(VLLM)
    assert detected == ServerCacheSettings("vllm", 32, 1638, True)
    cache = resolve_server_cache(detected, None, None)
    assert (cache.block_size, cache.model, cache.capacity_blocks) == (32, VllmPoolConfig(1638, 32), 1638)
    assert "detected" in cache.origins["block size"] and "vLLM-faithful pool" in cache.origins["pool"]


def test_flags_win_and_nothing_published_is_assumed():
    cache = resolve_server_cache(detect_cache_settings(VLLM), 16, 500)
    assert (cache.block_size, cache.model) == (16, CacheConfig(500, 16)) and "flag" in cache.origins["pool"]
    cache = resolve_server_cache(detect_cache_settings("other_metric 1.0\n"), None, None)
    assert (cache.block_size, cache.model) == (16, Unbounded(16))
    assert all(
        line.split(": ", 1)[1].startswith(("16 (assumed", "assumed", "unbounded (assumed"))
        for line in cache.lines()
    )


def test_sglang_is_recognized_by_its_counters():
    detected = detect_cache_settings(SGLANG)
    assert detected.server == "sglang" and detected.block_size is None
    counters = parse_prefix_cache_counters(SGLANG)
    assert (counters.queries_tokens, counters.hits_tokens, counters.family) == (
        1000.0,
        350.0,
        "sglang:prompt_tokens_total",
    )
    assert resolve_server_cache(detected, None, None).block_size == 1  # SGLang's default page size


def test_prefix_caching_off_expects_nothing_and_kvbench_serve_publishes_its_cache():
    off = render_metrics(ServerCounters(), "m", cache_config_labels(None, None))
    cache = resolve_server_cache(detect_cache_settings(off), None, None)
    assert cache.model is None and "off" in cache.origins["prefix caching"]
    on = detect_cache_settings(render_metrics(ServerCounters(), "m", cache_config_labels(16, 8192)))
    assert on == ServerCacheSettings("kvbench", 16, 8192, True)
    assert resolve_server_cache(on, None, None).model == CacheConfig(8192, 16)


def requests(num, prompt_tokens=64, max_tokens=8):
    ids = np.arange(prompt_tokens, dtype=np.uint32)
    return [Request(i, f"r{i}", f"r{i}", 0, ids, max_tokens=max_tokens) for i in range(num)]


def test_expectations_follow_the_chosen_model():
    same = requests(3)
    unbounded = server_expectations(same, resolve_server_cache(ServerCacheSettings(), None, None), True)
    assert unbounded.expected_cached_tokens == [0, 48, 48]  # (64 - 1) // 16 blocks of 16
    off = resolve_server_cache(ServerCacheSettings("vllm", 16, 100, False), None, None)
    assert server_expectations(same, off, True).expected_cached_tokens == [0, 0, 0]
    pool = resolve_server_cache(ServerCacheSettings("vllm", 16, 100, True), None, None)
    assert server_expectations(same, pool, True).expected_cached_tokens == [0, 48, 48]
    # 2 usable blocks: too small
    tiny = resolve_server_cache(ServerCacheSettings("vllm", 16, 3, True), None, None)
    expectations = server_expectations(same, tiny, True)
    assert expectations.expected_cached_tokens == [0, 48, 48] and "not replayable" in tiny.origins["pool"]


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_the_vllm_pool_needs_output_lengths(ignore_eos):
    cache = resolve_server_cache(ServerCacheSettings("vllm", 16, 100, True), None, None)
    server_expectations(requests(2), cache, ignore_eos)
    assert ("output lengths unknown" in cache.origins["pool"]) is (not ignore_eos)
