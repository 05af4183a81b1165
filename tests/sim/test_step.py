"""The one replay step (kvbench/sim/step.py) on every cache, and the predictor's online form built on it."""

from pathlib import Path

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig, make_cache
from kvbench.cache.block_hash import BlockHasher
from kvbench.run.scenario import load_scenario
from kvbench.sim.outputs import trace_outputs
from kvbench.sim.predict import OnlinePrediction, expected_cached_tokens
from kvbench.sim.step import release_step, step

B = 4
HASHER = BlockHasher(B)
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


class Clock:
    now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture(params=["hash", "radix"])
def build(request):
    """build(capacity_blocks, **config) -> (cache, clock): the two caches."""

    def make(capacity_blocks, **config):
        clock = Clock()
        config = CacheConfig(capacity_blocks, B, kind=request.param, **config)
        return make_cache(config, clock=clock), clock

    return make


def blocks(tokens):
    return HASHER.prompt_blocks(np.asarray(tokens, dtype=np.uint32))


def test_a_step_hits_under_the_last_token_cap_stores_the_rest_and_releases(build):
    cache, _ = build(10)
    first = step(cache, blocks(range(12)))
    assert (first.num_hit_blocks, first.num_inserted_blocks, first.handles) == (0, 3, None)
    again = step(cache, blocks(range(12)))
    assert (again.num_hit_blocks, again.num_hit_tokens) == (2, 8)  # (12 - 1) // 4 blocks
    assert again.new.num_existing_blocks == 1 and again.num_inserted_blocks == 0
    assert cache.num_evictable_blocks == 3  # nothing stays pinned
    cache.check_invariants()


def test_a_step_stores_the_blocks_it_is_given_or_none(build):
    cache, _ = build(10)
    with_output = step(cache, blocks(range(6)), blocks(range(13)))  # prompt + output - 1 tokens
    assert with_output.num_inserted_blocks == 3
    assert step(cache, blocks(range(13))).num_hit_blocks == 3
    failed = step(cache, blocks(range(100, 112)), store=False)
    assert (failed.num_hit_blocks, failed.num_inserted_blocks) == (0, 0)
    assert cache.num_cached_blocks == 3
    cache.check_invariants()


def test_a_step_says_what_it_evicted_and_what_expired(build):
    cache, clock = build(3, ttl_s=10.0)
    step(cache, blocks(range(8)))
    evicting = step(cache, blocks(range(50, 58)))
    assert evicting.num_evicted_blocks == 1 == cache.stats.num_evicted_blocks
    clock.now_s = 60.0
    expiring = step(cache, blocks(range(80, 88)))
    assert expiring.num_expired_blocks == 3 and expiring.num_evicted_blocks == 0
    cache.check_invariants()


def test_a_held_step_stays_pinned_until_it_is_released(build):
    cache, _ = build(4)
    running = step(cache, blocks(range(12)), hold=True)
    assert cache.num_evictable_blocks == 0 and running.handles
    refused = step(cache, blocks(range(50, 62)))
    assert refused.new.num_refused_blocks == 2 and refused.num_evicted_blocks == 0
    release_step(cache, running)
    assert cache.num_evictable_blocks == 4 and running.handles is None
    with pytest.raises(ValueError, match="holds nothing"):
        release_step(cache, running)
    cache.check_invariants()


def test_payloads_are_built_from_the_hit_and_a_failure_releases_it(build):
    cache, _ = build(10)
    step(cache, blocks(range(12)), payloads_for=lambda match: ["a", "b", "c"])
    seen = []

    def payloads_for(match):
        seen.append(list(match.payloads))
        return ["d"]

    step(cache, blocks(range(16)), payloads_for=payloads_for)
    assert seen == [["a", "b", "c"]]

    def refuse(match):
        raise RuntimeError("out of lockstep")

    with pytest.raises(RuntimeError, match="lockstep"):
        step(cache, blocks(range(16)), payloads_for=refuse)
    assert cache.num_evictable_blocks == cache.num_cached_blocks == 4  # the hit was released
    cache.check_invariants()


@pytest.mark.parametrize("kind", ["hash", "radix"])
def test_the_online_prediction_is_the_predictor_one_request_at_a_time(kind):
    requests = load_scenario(SCENARIOS / "chat.toml").workload_requests().requests[:60]
    outputs = [o if o is not None else np.arange(7, dtype=np.uint32) + 2**31 for o in trace_outputs(requests)]
    config = CacheConfig(capacity_blocks=300, block_size=16, kind=kind)
    online = OnlinePrediction(config)
    one_by_one = [online.finished(request, output) for request, output in zip(requests, outputs)]
    assert one_by_one == expected_cached_tokens(requests, config, outputs)
    assert sum(one_by_one) > 0
