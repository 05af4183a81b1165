"""Reuse breakdown: radix-tree prefixes against brute force, and the equality with the simulator."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.request import Request
from kvbench.sim.replay import ideal_hit_rate, prepare_prompts
from kvbench.workloads.conversations import ChatConfig
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.kinds import generate_trace
from kvbench.workloads.trace_stats import Distribution, longest_cached_prefixes, reuse_breakdown, summarize


def brute_force_lcp(requests):
    result = []
    for i, request in enumerate(requests):
        best = 0
        for earlier in requests[:i]:
            if earlier.salt != request.salt:
                continue
            a, b = request.token_ids.tolist(), earlier.token_ids.tolist()
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            best = max(best, k)
        result.append(best)
    return result


# Prompts built from a few shared stems so that prefixes overlap, split and repeat exactly.
STEMS = [list(range(100, 140)), list(range(100, 120)) + [7] * 30, [5, 6, 7]]
PROMPTS = st.lists(
    st.tuples(
        st.sampled_from(range(len(STEMS))),
        st.integers(0, 45),
        st.lists(st.integers(0, 3), max_size=20),
        st.sampled_from(["", "", "tenant-b"]),
    ),
    min_size=1,
    max_size=25,
)


def token_request(token_ids, arrival_s=0.0, salt=None):
    return Request(
        int(arrival_s),
        f"r{arrival_s}",
        f"s{arrival_s}",
        0,
        np.asarray(token_ids, dtype=np.uint32),
        arrival_s=arrival_s,
        salt=salt,
    )


def build(specs):
    requests = []
    for index, (stem, cut, tail, salt) in enumerate(specs):
        tokens = STEMS[stem][:cut] + tail or [1]
        requests.append(token_request(np.asarray(tokens, dtype=np.uint32), arrival_s=float(index), salt=salt))
    return requests


@settings(max_examples=120, deadline=None)
@given(PROMPTS)
def test_radix_prefixes_match_brute_force(specs):
    requests = build(specs)
    lcp, lengths = longest_cached_prefixes(requests)
    assert lcp.tolist() == brute_force_lcp(requests)
    assert lengths.tolist() == [r.num_tokens for r in requests]


@settings(max_examples=100, deadline=None)
@given(PROMPTS, st.sampled_from([1, 2, 4, 16]))
def test_capped_block_reuse_is_the_simulators_ideal(specs, block_size):
    requests = build(specs)
    breakdown = reuse_breakdown(*longest_cached_prefixes(requests), block_size)
    ideal = ideal_hit_rate(prepare_prompts(requests, block_size))
    assert breakdown.num_block_tokens_capped == ideal.num_cached_tokens
    assert breakdown.ideal_hit_rate == pytest.approx(ideal.token_hit_rate)
    total = breakdown.ideal_hit_rate + breakdown.lost_to_last_token_rule + breakdown.lost_to_partial_blocks
    assert total == pytest.approx(breakdown.reusable_rate)


def test_a_repeated_block_aligned_prompt_loses_a_whole_block_to_the_last_token_rule():
    prompt = np.arange(32, dtype=np.uint32)
    requests = [token_request(prompt, arrival_s=0.0), token_request(prompt, arrival_s=1.0)]
    breakdown = reuse_breakdown(*longest_cached_prefixes(requests), 16)
    assert breakdown.num_reusable_tokens == 32 and breakdown.num_block_tokens_uncapped == 32
    assert breakdown.num_block_tokens_capped == 16  # (32 - 1) // 16 blocks may hit
    assert breakdown.lost_to_last_token_rule == pytest.approx(16 / 64)
    assert breakdown.lost_to_partial_blocks == 0.0


def test_partial_blocks_lose_the_tail_of_the_shared_prefix():
    requests = [
        token_request(np.arange(40, dtype=np.uint32), arrival_s=0.0),
        token_request(np.concatenate([np.arange(20), [999] * 20]).astype(np.uint32), arrival_s=1.0),
    ]
    breakdown = reuse_breakdown(*longest_cached_prefixes(requests), 16)
    assert breakdown.num_reusable_tokens == 20 and breakdown.num_block_tokens_capped == 16
    assert breakdown.lost_to_partial_blocks == pytest.approx(4 / 80)


def test_generated_chat_trace_agrees_with_the_simulator(tokenizer):
    trace = generate_trace("chat", ChatConfig(num_conversations=5, turns=3, system_tokens=100), tokenizer)
    requests = trace_requests(trace, tokenizer)
    lcp, lengths = longest_cached_prefixes(requests)
    for block_size in (16, 64):
        ideal = ideal_hit_rate(prepare_prompts(requests, block_size))
        assert reuse_breakdown(lcp, lengths, block_size).num_block_tokens_capped == ideal.num_cached_tokens
    summary = summarize(requests, trace)
    assert summary.num_requests == 15 and summary.num_sessions == 5
    assert summary.prompt_tokens.total == sum(r.expected_prompt_tokens for r in trace.requests)
    assert summary.output_budget_tokens.total == sum(r.max_tokens for r in trace.requests)


def test_distribution_of_values():
    values = Distribution.of([1, 2, 3, 4, 100])
    assert (values.mean, values.p50, values.total) == (22.0, 3.0, 110)
    assert values.p99 == pytest.approx(96.16)
    assert Distribution.of([]).total == 0
