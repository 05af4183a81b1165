"""Head-first release from one pass per truncation equals the head-first replay, request by request."""

from dataclasses import replace

import numpy as np
import pytest
from curve_traces import BLOCK, counts, orphan_trace, traces
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_workloads import numbered_requests

from kvbench.cache.base import CacheConfig, ReleaseOrder
from kvbench.sim.curve import one_pass_refusal
from kvbench.sim.head_first import head_first_curve, head_first_results
from kvbench.sim.replay import prepare_prompts, simulate

HEAD_FIRST = ReleaseOrder.HEAD_FIRST


def replayed(trace, capacity):
    return simulate(trace, CacheConfig(capacity_blocks=capacity, block_size=BLOCK, release_order=HEAD_FIRST))


def same_result(replay, computed):
    assert (replay.method, computed.method, computed.release_order) == ("replay", "one-pass", "head-first")
    assert counts(replay) == counts(computed)
    assert replay.cached_tokens_per_request.tolist() == computed.cached_tokens_per_request.tolist()


@settings(max_examples=60, deadline=None)
@given(traces())
def test_head_first_equals_the_replay_at_every_size(requests):
    trace = prepare_prompts(requests, BLOCK)
    longest = max(prompt.num_full_blocks for prompt in trace.prompts)
    capacities = list(range(1, max(longest, trace.num_full_blocks) + 2))
    for capacity, result in zip(capacities, head_first_results(trace, capacities)):
        same_result(replayed(trace, capacity), result)


@settings(max_examples=100, deadline=None)
@given(traces(), st.lists(st.integers(1, 60), min_size=1, max_size=6))
def test_head_first_equals_the_replay_at_random_capacities_in_any_order(requests, capacities):
    trace = prepare_prompts(requests, BLOCK)
    for capacity, result in zip(capacities, head_first_results(trace, capacities)):
        same_result(replayed(trace, capacity), result)


def test_the_uncut_pass_is_exact_from_the_longest_request_up_and_wrong_below():
    trace = orphan_trace()
    curve = head_first_curve(trace)  # 9 full blocks per request: exact from 9 blocks on
    assert [curve.result_at(c).num_hit_blocks for c in range(9, 30)] == [
        replayed(trace, c).num_hit_blocks for c in range(9, 30)
    ]
    assert curve.result_at(8).as_row() != replayed(trace, 8).as_row()  # why smaller sizes get their own pass
    tail_first = simulate(trace, CacheConfig(capacity_blocks=24, block_size=BLOCK))
    assert replayed(trace, 24).num_hit_blocks < tail_first.num_hit_blocks


def test_head_first_is_not_refused_but_its_ttl_still_is():
    base = CacheConfig(capacity_blocks=8, block_size=BLOCK, release_order=HEAD_FIRST)
    assert one_pass_refusal(base) is None
    assert "TTL" in one_pass_refusal(replace(base, ttl_s=5.0))


def test_head_first_results_refuse_a_non_positive_capacity():
    with pytest.raises(ValueError, match="positive"):
        head_first_results(orphan_trace(), [4, 0])


def test_a_trace_that_stores_outputs_is_replayed_and_one_pass_refuses_it():
    from kvbench.errors import InputError
    from kvbench.sim.method import SimMethod, simulate_sizes
    from kvbench.sim.outputs import placeholder_outputs

    requests = numbered_requests((np.arange(i, i + 13) % 5 for i in range(6)), max_tokens=9)
    trace = prepare_prompts(requests, BLOCK, outputs=placeholder_outputs(requests))
    base = CacheConfig(capacity_blocks=1, block_size=BLOCK)
    outcome = simulate_sizes(trace, base, [3, 8], ["tail-first", "head-first"])
    assert outcome.methods == {"tail-first": "replay", "head-first": "replay"}
    assert all("generated blocks" in note for note in outcome.notes) and len(outcome.notes) == 2
    replay = simulate(trace, CacheConfig(capacity_blocks=3, block_size=BLOCK))
    assert counts(outcome.results[0]) == counts(replay)
    with pytest.raises(InputError, match="generated blocks"):
        simulate_sizes(trace, base, [3], ["tail-first"], SimMethod.ONE_PASS)
