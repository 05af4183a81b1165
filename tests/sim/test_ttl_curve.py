"""The one-pass TTL curve equals the replay with an unbounded cache at every TTL."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_curve import BLOCK, traces

from kvbench.cache.base import CacheConfig
from kvbench.request import Request
from kvbench.sim.bounds import unbounded_capacity_blocks
from kvbench.sim.replay import prepare_prompts, simulate
from kvbench.sim.ttl_curve import ttl_curve


def unbounded(trace):
    return unbounded_capacity_blocks((p.num_tokens for p in trace.prompts), trace.block_size)


@settings(max_examples=80, deadline=None)
@given(traces(), st.lists(st.sampled_from([0.5, 1.5, 2.5, 3.5, 10.0]), min_size=1, max_size=3))
def test_ttl_curve_equals_the_replay(requests, ttls):
    trace = prepare_prompts(requests, BLOCK)
    curve = ttl_curve(trace)
    for ttl in ttls:
        replayed = simulate(trace, CacheConfig(capacity_blocks=unbounded(trace), block_size=BLOCK, ttl_s=ttl))
        assert curve.hit_blocks(np.array([ttl]))[0] == replayed.num_hit_blocks
        assert curve.token_hit_rates(np.array([ttl]))[0] == pytest.approx(replayed.token_hit_rate)


def test_a_conversation_needs_a_ttl_longer_than_its_think_time():
    """Two sessions, each turn 30 s after the last: a TTL under 30 s loses every reuse."""
    rng = np.random.default_rng(0)
    requests, prefixes = [], [rng.integers(0, 1000, size=64) for _ in range(2)]
    for turn in range(4):
        for session in range(2):
            tokens = np.concatenate([prefixes[session], rng.integers(0, 1000, size=3)]).astype(np.uint32)
            requests.append(
                Request(
                    index=len(requests),
                    request_id=f"r{len(requests)}",
                    session_id=f"s{session}",
                    turn=turn,
                    token_ids=tokens,
                    arrival_s=30.0 * turn + session,
                )
            )
    curve = ttl_curve(prepare_prompts(requests, 16))
    assert curve.change_points_s().tolist() == [30.0]
    assert curve.hit_blocks(np.array([29.9, 30.0])).tolist() == [0, 6 * 4]
    assert curve.ttl_for_fraction_s(0.9) == 30.0
    assert curve.rows()[0]["hit_blocks"] == 24
