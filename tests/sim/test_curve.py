"""The one-pass curve equals the replay, request by request, at every capacity; refusals fall back."""

from dataclasses import replace

import numpy as np
import pytest
from curve_traces import BLOCK, counts, orphan_trace, traces
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_workloads import numbered_requests

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.cache.block_hash import HashConfig
from kvbench.request import Request
from kvbench.sim.curve import hit_curve, one_pass_refusal
from kvbench.sim.replay import prepare_prompts, simulate
from kvbench.sim.stack_distance import FenwickTree


def same_result(replayed, computed):
    assert (replayed.method, computed.method) == ("replay", "one-pass")
    assert counts(replayed) == counts(computed)
    assert replayed.cached_tokens_per_request.tolist() == computed.cached_tokens_per_request.tolist()


@settings(max_examples=150, deadline=None)
@given(traces(), st.lists(st.integers(1, 60), min_size=1, max_size=6))
def test_curve_equals_the_replay_at_random_capacities(requests, capacities):
    trace = prepare_prompts(requests, BLOCK)
    curve = hit_curve(trace)
    for capacity in capacities:
        same_result(
            simulate(trace, CacheConfig(capacity_blocks=capacity, block_size=BLOCK)),
            curve.result_at(capacity),
        )


@settings(max_examples=40, deadline=None)
@given(traces())
def test_curve_equals_the_replay_at_every_size_up_to_the_ideal(requests):
    trace = prepare_prompts(requests, BLOCK)
    curve = hit_curve(trace)
    rows = {r.capacity_blocks: r for r in curve.results()}
    for capacity in range(1, curve.ideal_capacity_blocks + 2):
        replayed = simulate(trace, CacheConfig(capacity_blocks=capacity, block_size=BLOCK))
        same_result(replayed, curve.result_at(capacity))
        if capacity in rows:
            assert counts(rows[capacity]) == counts(replayed)


def test_change_points_are_exactly_where_the_hit_count_rises():
    rng = np.random.default_rng(7)
    shared = rng.integers(0, 1000, size=40)
    requests = numbered_requests(
        np.concatenate([shared[: int(rng.integers(8, 41))], rng.integers(0, 1000, size=9)]) for _ in range(30)
    )
    trace = prepare_prompts(requests, BLOCK)
    curve = hit_curve(trace)
    hits = [
        simulate(trace, CacheConfig(capacity_blocks=c, block_size=BLOCK)).num_hit_blocks
        for c in range(1, curve.ideal_capacity_blocks + 3)
    ]
    rises = [1] + [c for c in range(2, len(hits) + 1) if hits[c - 1] > hits[c - 2]]
    assert curve.change_points().tolist() == rises
    assert hits[-1] == hits[curve.ideal_capacity_blocks - 1] > hits[curve.ideal_capacity_blocks - 2]


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"kind": CacheKind.RADIX}, "radix"),
        ({"ttl_s": 5.0}, "TTL"),
        ({"hash": HashConfig(hash_bits=16)}, "collide"),
        ({"verify_tokens": True}, "collide"),
    ],
)
def test_configs_the_one_pass_does_not_cover_are_refused_with_a_reason(change, needle):
    base = CacheConfig(capacity_blocks=8, block_size=BLOCK)
    assert one_pass_refusal(base) is None
    assert needle in one_pass_refusal(replace(base, **change))


def test_head_first_really_differs_from_any_stack_algorithm():
    """Why head-first has its own passes (kvbench.sim.head_first): its replay is not the tail-first curve."""
    trace = orphan_trace()
    curve = hit_curve(trace)
    differs = [
        c
        for c in range(1, 40)
        if simulate(
            trace, CacheConfig(capacity_blocks=c, block_size=BLOCK, release_order="head-first")
        ).num_hit_blocks
        != curve.result_at(c).num_hit_blocks
    ]
    assert differs


def test_fenwick_tree_prefix_sums_match_a_running_sum():
    rng = np.random.default_rng(0)
    counts, tree = np.zeros(37, dtype=np.int64), FenwickTree(37)
    for position, delta in zip(rng.integers(0, 37, size=300), rng.integers(-3, 4, size=300)):
        counts[position] += delta
        tree.add(int(position), int(delta))
        assert [tree.prefix_sum(p) for p in range(-1, 37)] == [0, *np.cumsum(counts).tolist()]
    assert tree.total == counts.sum()


def test_result_at_refuses_a_non_positive_capacity():
    trace = prepare_prompts(
        [Request(index=0, request_id="r", session_id="s", turn=0, token_ids=np.arange(9, dtype=np.uint32))],
        BLOCK,
    )
    with pytest.raises(ValueError, match="positive"):
        hit_curve(trace).result_at(0)


def test_range_fenwick_tree_matches_a_running_sum():
    from kvbench.sim.stack_distance import RangeFenwickTree

    rng = np.random.default_rng(1)
    counts, tree = np.zeros(41, dtype=np.int64), RangeFenwickTree(41)
    for _ in range(200):
        first = int(rng.integers(0, 41))
        last, delta = int(rng.integers(first, 41)), int(rng.integers(-2, 3))
        counts[first : last + 1] += delta
        tree.add_range(first, last, delta)
        assert [tree.prefix_sum(p) for p in range(-1, 41)] == [0, *np.cumsum(counts).tolist()]
