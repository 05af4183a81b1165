"""KV tiers: the one-pass split equals an explicit multi-tier replay, request by request and tier by tier."""

import numpy as np
import pytest
from curve_traces import BLOCK, traces
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_workloads import numbered_requests

from kvbench.cache.base import CacheConfig
from kvbench.errors import InputError
from kvbench.sim.replay import prepare_prompts, simulate
from kvbench.sim.stack_distance import stack_distances
from kvbench.sim.tier_replay import replay_tiers
from kvbench.sim.tiers import Tier, TierPolicy, one_pass_tier_refusal, parse_bandwidth, parse_tier, tier_split


def split_of(trace, gpu, tiers, policy):
    distances = stack_distances(trace.prompts)
    tokens = np.array([p.num_tokens for p in trace.prompts])
    return distances, tier_split(distances, gpu, tiers, policy, trace.block_size, tokens)


def host(blocks, name="host"):
    return Tier(name, blocks, 25e9)


@settings(max_examples=80, deadline=None)
@given(traces(), st.integers(1, 40))
def test_the_replay_without_tiers_is_the_project_replay(requests, gpu):
    trace = prepare_prompts(requests, BLOCK)
    replayed = replay_tiers(trace.prompts, gpu, (), TierPolicy.EXCLUSIVE, BLOCK)
    reference = simulate(trace, CacheConfig(capacity_blocks=gpu, block_size=BLOCK))
    assert (replayed.hit_tokens[0] == reference.cached_tokens_per_request).all()


@settings(max_examples=150, deadline=None)
@given(
    traces(),
    st.integers(1, 40),
    st.lists(st.integers(0, 40), min_size=1, max_size=2),
    st.sampled_from(list(TierPolicy)),
)
def test_one_pass_split_equals_the_replay_request_by_request(requests, gpu, sizes, policy):
    trace = prepare_prompts(requests, BLOCK)
    tiers = tuple(host(size, f"t{i}") for i, size in enumerate(sizes))
    distances, split = split_of(trace, gpu, tiers, policy)
    replayed = replay_tiers(trace.prompts, gpu, tiers, policy, BLOCK)
    if one_pass_tier_refusal(distances, gpu, policy) is None:
        assert split.hit_blocks.tolist() == replayed.hit_blocks.tolist()
    assert (split.missed_tokens >= 0).all() and (replayed.missed_tokens >= 0).all()


def alternating(num_requests=8, blocks=4):
    """Two 4-block system prompts, A then B then A ..., each with a 1-token question (cap = 4 blocks)."""
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(0, 1000, size=blocks * BLOCK) for _ in range(2)]
    return numbered_requests(
        (np.append(prefixes[i % 2], 7) for i in range(num_requests)), session_id=lambda i: f"s{i}"
    )


def test_a_host_tier_catches_what_a_small_gpu_evicts():
    trace = prepare_prompts(alternating(), BLOCK)
    for policy, host_blocks in ((TierPolicy.EXCLUSIVE, 4), (TierPolicy.INCLUSIVE, 8)):
        _, split = split_of(trace, 4, (host(host_blocks),), policy)
        assert split.hit_blocks[0].tolist() == [0] * 8  # A and B evict each other from a 4-block GPU
        assert split.hit_blocks[1].tolist() == [0, 0] + [4] * 6  # ... and the host serves them back
        assert split.missed_tokens.tolist() == [17, 17] + [1] * 6


def test_an_inclusive_tier_no_larger_than_the_gpu_adds_nothing():
    trace = prepare_prompts(alternating(), BLOCK)
    _, split = split_of(trace, 4, (host(4),), TierPolicy.INCLUSIVE)
    assert split.hit_blocks.sum() == 0


def test_exclusive_one_pass_is_refused_when_a_request_exceeds_the_gpu():
    trace = prepare_prompts(alternating(), BLOCK)
    distances = stack_distances(trace.prompts)
    assert "exceeds the GPU's 3" in one_pass_tier_refusal(distances, 3, TierPolicy.EXCLUSIVE)
    assert one_pass_tier_refusal(distances, 3, TierPolicy.INCLUSIVE) is None


def test_tier_specs_parse_blocks_bytes_and_bandwidth():
    assert parse_tier("host:4096", 1 << 20) == Tier("host", 4096, 25e9, 0.01, assumed=True)
    assert parse_tier("host:64GiB:10GBps", 1 << 20) == Tier("host", 65536, 10e9, 0.01, assumed=True)
    assert parse_tier("disk:1TiB", 1 << 21).bandwidth_bytes_per_s == 3e9
    assert parse_bandwidth("800MB/s") == 8e8


@pytest.mark.parametrize(
    "text, needle",
    [
        ("host", "NAME:SIZE"),
        ("nvme:1GiB", "no default bandwidth"),
        ("host:lots", "not a byte size"),
        ("host:1GiB:fast", "not a bandwidth"),
    ],
)
def test_bad_tier_specs_are_refused_in_one_line(text, needle):
    with pytest.raises(InputError, match=needle):
        parse_tier(text, 1 << 20)


def mooncake(shared_data, limit):
    from kvbench.sim.hash_id_trace import hash_id_trace

    return hash_id_trace(shared_data / "mooncake" / "conversation_trace.jsonl", "mooncake", 512, limit)


@pytest.mark.parametrize("policy", list(TierPolicy))
def test_on_the_mooncake_trace_the_one_pass_equals_the_replay_request_by_request(shared_data, policy):
    trace = mooncake(shared_data, 4000)
    gpu = max(p.num_full_blocks for p in trace.prompts)  # every request fits: exact for both policies
    tiers = (
        (host(gpu), host(3 * gpu, "disk"))
        if policy is TierPolicy.EXCLUSIVE
        else (host(2 * gpu), host(5 * gpu, "disk"))
    )
    distances, split = split_of(trace, gpu, tiers, policy)
    replayed = replay_tiers(trace.prompts, gpu, tiers, policy, 512)
    assert split.hit_blocks.tolist() == replayed.hit_blocks.tolist()
    assert split.hit_blocks[1].sum() > 0 and split.hit_blocks[2].sum() > 0  # both tiers serve something


@pytest.mark.parametrize("scenario", ["multi_prefix_rr", "multi_prefix_zipf"])
@pytest.mark.parametrize("policy", list(TierPolicy))
def test_on_the_multi_prefix_scenarios_the_one_pass_equals_the_replay(scenario, policy):
    from kvbench.run.source import load_source

    trace = prepare_prompts(load_source(f"scenarios/{scenario}.toml").requests, 16)
    tiers = (host(1024),)
    distances, split = split_of(trace, 256, tiers, policy)
    assert (
        split.hit_blocks.tolist() == replay_tiers(trace.prompts, 256, tiers, policy, 16).hit_blocks.tolist()
    )
    assert split.hit_blocks[1].sum() > 0
