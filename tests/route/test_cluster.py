"""Simulated replicas: each replica's cache is the real cache, so its hits are a single-cache replay."""

import math

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.route.api import RouterOptions, compare_policies, make_router
from kvbench.route.cache_aware import CacheAwareConfig
from kvbench.route.cluster import ClusterConfig, prepare_route_trace, simulate_cluster
from kvbench.route.policies import PolicyName, load_bound
from kvbench.route.service import ServiceModel
from kvbench.sim.replay import replay

SLOW = ServiceModel(prefill_base_ms=50.0, prefill_ms_per_token=5.0, decode_ms_per_token=50.0)  # queues form


@pytest.mark.parametrize("kind", [CacheKind.HASH, CacheKind.RADIX])
def test_round_robin_replica_hits_equal_a_single_cache_replay_of_what_it_received(chat8, kind):
    cache = CacheConfig(capacity_blocks=96, block_size=16, kind=kind)  # small: evictions happen
    trace = prepare_route_trace(chat8, cache)
    run = simulate_cluster(trace, make_router("round-robin", 8, 16), ClusterConfig(8, cache, SLOW))
    assert run.replica.tolist() == [i % 8 for i in range(len(chat8))]
    evictions = 0
    for replica in range(8):
        mine = [r for r, chosen in zip(chat8, run.replica) if chosen == replica]
        alone = replay(mine, cache)
        assert run.cached_tokens[run.replica == replica].tolist() == alone.cached_tokens_per_request.tolist()
        evictions += alone.num_evicted_blocks
    assert evictions > 0 and run.cached_tokens.sum() > 0


def test_session_routing_gives_the_single_cache_hit_rate_when_each_cache_holds_its_sessions(chat8_tenants):
    cache = CacheConfig(capacity_blocks=100_000, block_size=16)
    single = replay(chat8_tenants, cache)
    trace = prepare_route_trace(chat8_tenants, cache)
    (session, rr) = compare_policies(trace, ClusterConfig(8, cache), ["session", "round-robin"])
    assert session.run.cached_tokens.tolist() == single.cached_tokens_per_request.tolist()
    assert session.token_hit_rate == pytest.approx(single.token_hit_rate) and single.token_hit_rate > 0.5
    by_session = {}
    for request, replica in zip(chat8_tenants, session.run.replica):
        by_session.setdefault(request.session_id, set()).add(int(replica))
    assert all(len(replicas) == 1 for replicas in by_session.values())  # a conversation stays put
    assert rr.token_hit_rate < 0.5 * single.token_hit_rate  # turn k+1 lands elsewhere 7 times in 8


def test_every_policy_on_one_replica_is_the_single_cache_replay(chat8):
    cache = CacheConfig(capacity_blocks=64, block_size=16)
    expected = replay(chat8, cache).cached_tokens_per_request.tolist()
    trace = prepare_route_trace(chat8, cache, keep_tokens=True)  # kv_aware reads the blocks' tokens
    for result in compare_policies(trace, ClusterConfig(1, cache, SLOW), list(PolicyName)):
        assert result.run.cached_tokens.tolist() == expected, result.policy


def test_bounded_loads_never_exceed_the_bound(chat8):
    cache = CacheConfig(capacity_blocks=4096, block_size=16)
    trace = prepare_route_trace(chat8, cache)  # every prompt starts with the same 200-token system prompt
    options = RouterOptions(prefix_tokens=128, epsilon=0.25)
    run = simulate_cluster(trace, make_router("prefix-hash", 4, 16, options), ClusterConfig(4, cache, SLOW))
    for loads, replica in zip(run.loads, run.replica):
        assert (
            loads[replica] + 1 <= load_bound(loads.tolist(), 0.25) == math.ceil(1.25 * (loads.sum() + 1) / 4)
        )
    assert len(set(run.replica.tolist())) > 1  # one key for everyone, yet the bound spread the load
    assert run.loads.max() > 1  # queues did form, so the bound was tested


def test_queue_time_and_ttft_follow_the_service_model(chat8):
    cache = CacheConfig(capacity_blocks=4096, block_size=16)
    trace = prepare_route_trace(chat8, cache)
    model = ServiceModel(prefill_base_ms=7.0, prefill_ms_per_token=0.5, decode_ms_per_token=3.0)
    run = simulate_cluster(trace, make_router("least-loaded", 2, 16), ClusterConfig(2, cache, model))
    uncached = np.array([p.num_tokens for p in trace.prompts]) - run.cached_tokens
    assert np.allclose(run.ttft_ms - run.queue_ms, 7.0 + 0.5 * uncached)
    assert np.allclose(run.e2e_ms - run.ttft_ms, 3.0 * (trace.output_tokens - 1))
    assert np.allclose(run.busy_ms.sum(), (7.0 + 0.5 * uncached).sum())
    assert (run.queue_ms >= 0).all()


def test_cache_aware_falls_back_to_the_least_loaded_under_heavy_load(chat8):
    cache = CacheConfig(capacity_blocks=4096, block_size=16)
    trace = prepare_route_trace(chat8, cache)
    options = RouterOptions(cache_aware=CacheAwareConfig(balance_abs_threshold=2, balance_rel_threshold=1.5))
    light = compare_policies(trace, ClusterConfig(4, cache), ["cache-aware"])[0]
    heavy = compare_policies(trace, ClusterConfig(4, cache, SLOW), ["cache-aware"], options)[0]
    assert light.decisions["balance"] == 0 and set(light.run.replica.tolist()) == {0}  # affinity: one replica
    assert heavy.decisions["balance"] > 0 and len(set(heavy.run.replica.tolist())) > 1


def test_popular_prefix_copies(chat8):
    cache = CacheConfig(capacity_blocks=4096, block_size=16)
    trace = prepare_route_trace(chat8, cache)
    assert list(trace.popular.values()) == [8]  # the system prompt, sent by all 8 conversations
    rr, aware = compare_policies(trace, ClusterConfig(8, cache), ["round-robin", "cache-aware"])
    assert rr.prefix_copies() == [8] and aware.prefix_copies() == [1]


def test_equally_shared_prefixes_rank_in_the_order_the_trace_sent_them():
    """Ties never follow a set's hash order (byte keys hash differently in every process)."""
    from kvbench.cache.block_hash import PromptBlocks
    from kvbench.route.cluster import popular_prefixes

    def prompt(*keys: bytes) -> PromptBlocks:
        return PromptBlocks(16 * len(keys), 16, keys, None, b"")

    keys = [bytes([i]) * 8 for i in range(12)]  # twelve prefixes, each sent by two sessions
    prompts = [prompt(key) for key in keys for _ in range(2)]
    sessions = [f"s{i}" for i in range(len(prompts))]
    assert list(popular_prefixes(prompts, sessions, 5)) == keys[:5]
    shared_by_three = [*prompts, prompt(keys[7])]
    assert list(popular_prefixes(shared_by_three, [*sessions, "s99"], 3)) == [keys[7], keys[0], keys[1]]
