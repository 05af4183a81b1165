"""The one Prometheus parser: prefix-cache counters of every naming and exposition style, vLLM's pool size."""

from kvbench.backends.openai.metrics import (
    PrefixCacheCounters,
    metric_samples,
    parse_prefix_cache_counters,
    vllm_num_gpu_blocks,
)
from kvbench.server.metrics import ServerCounters, render_metrics

# What vLLM (prometheus_client) writes: the counter's TYPE line names its _total samples.
VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="llama"} 500.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="llama"} 600.0
vllm:prefix_cache_hits_total{engine="1",model_name="llama"} 150.0
vllm:gpu_prefix_cache_queries_total{model_name="llama"} 7.0
vllm:gpu_prefix_cache_hits_total{model_name="llama"} 7.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",num_gpu_blocks="1638"} 1.0
"""
# An older header style: the family named without _total above _total samples (read as untyped).
BARE_FAMILY = """\
# HELP vllm:prefix_cache_queries Prefix cache queries.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0"} 40.0
vllm:prefix_cache_hits_total{engine="0"} 16.0
"""


def test_counters_are_read_from_vllm_names_summed_over_engines():
    counters = parse_prefix_cache_counters(VLLM_METRICS)
    assert counters == PrefixCacheCounters(1500.0, 750.0, "vllm:prefix_cache_queries_total")
    assert parse_prefix_cache_counters(BARE_FAMILY) == PrefixCacheCounters(
        40.0, 16.0, "vllm:prefix_cache_queries_total"
    )
    assert parse_prefix_cache_counters("# nothing here\nother_metric 3\n") is None
    assert parse_prefix_cache_counters(None) is None and parse_prefix_cache_counters("") is None


def test_the_gpu_names_count_when_they_are_all_there_is():
    text = 'vllm:gpu_prefix_cache_queries_total{model_name="x"} 9.0\nvllm:gpu_prefix_cache_hits_total 4.0\n'
    assert parse_prefix_cache_counters(text) == PrefixCacheCounters(
        9.0, 4.0, "vllm:gpu_prefix_cache_queries_total"
    )


def test_a_delta_needs_the_same_family():
    before = PrefixCacheCounters(100.0, 10.0, "vllm:prefix_cache_queries_total")
    after = PrefixCacheCounters(250.0, 70.0, "vllm:prefix_cache_queries_total")
    assert after.since(before) == PrefixCacheCounters(150.0, 60.0, "vllm:prefix_cache_queries_total")
    assert after.since(None) is None
    assert after.since(PrefixCacheCounters(1.0, 1.0, "kvbench:prefix_cache_queries_total")) is None


def test_vllm_pool_size_and_malformed_text():
    assert vllm_num_gpu_blocks(VLLM_METRICS) == 1638
    assert vllm_num_gpu_blocks('vllm:cache_config_info{num_gpu_blocks="None"} 1.0\n') is None
    assert vllm_num_gpu_blocks(None) is None
    samples = metric_samples("good_metric 1.0\nthis is { not prometheus\nlater 2.0\n")
    assert [(s.name, s.value) for s in samples] == [("good_metric", 1.0)]  # up to the first bad line


def test_kvbench_serve_exposition_reads_back():
    counters = ServerCounters()
    counters.record_success(prompt_tokens=93, cached_tokens=64, output_tokens=3)
    counters.num_in_flight = 3
    text = render_metrics(counters, 'my "model"\n')
    assert parse_prefix_cache_counters(text) == PrefixCacheCounters(
        93.0, 64.0, "kvbench:prefix_cache_queries_total"
    )
    values = {s.name: (s.labels, s.value) for s in metric_samples(text)}
    assert values["kvbench:num_requests_running"] == ({"model_name": 'my "model"\n'}, 1.0)
    assert values["kvbench:num_requests_waiting"][1] == 2.0
    assert values["kvbench:generation_tokens_total"][1] == 3.0
    assert "# TYPE kvbench:prefix_cache_queries_total counter" in text.splitlines()
