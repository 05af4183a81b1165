"""THE expected-cached-tokens predictor (kvbench/sim/predict.py) and the bounds (kvbench/sim/bounds.py).

Hand-derived values on block size 4, then agreement with ``sim.replay.simulate`` and the vLLM pool.
(Before the switch, it gave exactly the numbers of the four copies it replaced, on six cache configs
and four reconcile capacities over 200 scenario requests.)
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig, CacheKind, ReleaseOrder
from kvbench.request import Request
from kvbench.run.scenario import load_scenario
from kvbench.sim.bounds import possible_cached_tokens, unbounded_capacity_blocks
from kvbench.sim.outputs import placeholder_outputs
from kvbench.sim.predict import Unbounded, expected_cached_tokens
from kvbench.sim.replay import prepare_prompts, prompt_blocks_of, simulate
from kvbench.sim.vllm_pool import VllmPoolConfig, simulate_vllm

B = 4
A = list(range(100, 112))  # three blocks: A0 A1 A2
C = list(range(200, 212))
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def req(tokens, index=0, salt=None, output=None, arrival_s=0.0):
    return Request(
        index,
        f"r{index}",
        f"s{index}",
        0,
        np.asarray(tokens, dtype=np.uint32),
        arrival_s=arrival_s,
        salt=salt,
        output_tokens=output,
    )


def reqs(*token_lists, **fields):
    return [req(tokens, index=i, **fields) for i, tokens in enumerate(token_lists)]


def cache(capacity_blocks, prompt_only=True, **fields):
    """The hand-derived cases below count prompt blocks only (``prompt_only``); generated blocks,
    the default, have their own tests (test_generated_blocks_*)."""
    return CacheConfig(capacity_blocks=capacity_blocks, block_size=B, prompt_only=prompt_only, **fields)


def test_hand_derived_unbounded_cap_floor_and_first_miss():
    requests = reqs(A, A, A + [1], A[:7], A[:4] + [0] + A[5:], [5, 5])
    # A: cold. A again: cap (12 - 1) // 4 = 2 blocks. A + [1]: 3 blocks. A[:7]: cap 1 block.
    # block 1 changed: only A0 hits. Two tokens: no full block.
    assert expected_cached_tokens(requests, Unbounded(B)) == [0, 8, 12, 4, 4, 0]


def test_cache_off_is_zero_and_a_ttl_is_unknown():
    requests = reqs(A, A + [1])
    assert expected_cached_tokens(requests, None) == [0, 0]
    assert expected_cached_tokens(requests, cache(100, ttl_s=5.0)) == [None, None]
    assert expected_cached_tokens([], Unbounded(B)) == []


def test_bounded_cache_evicts_lru_tail_first():
    # 3 blocks: A0 A1 A2 fill it; C evicts A's tail first (A2, A1, A0 order), so A + [1] later hits nothing.
    requests = reqs(A, C, A + [1])
    assert expected_cached_tokens(requests, cache(3)) == [0, 0, 0]
    # 4 blocks: C takes 3 of 4, evicting A2 and A1: A0 survives.
    assert expected_cached_tokens(requests, cache(4)) == [0, 0, 4]
    assert expected_cached_tokens(requests, Unbounded(B)) == [0, 0, 12]
    # head-first release evicts A0 first, orphaning A1: nothing hits.
    assert expected_cached_tokens(requests, cache(4, release_order=ReleaseOrder.HEAD_FIRST)) == [0, 0, 0]


def test_salt_none_is_the_public_namespace_and_salts_are_namespaces():
    requests = [
        req(A, 0, salt=None),
        req(A + [1], 1, salt=""),
        req(A + [1], 2, salt="t"),
        req(A + [2], 3, salt="t"),
    ]
    assert expected_cached_tokens(requests, Unbounded(B)) == [0, 12, 0, 12]


@pytest.mark.parametrize("kind", list(CacheKind))
def test_radix_and_hash_agree_when_nothing_is_evicted(kind):
    requests = reqs(A, A[:9], A + C, C, A + C + [1], salt="x")
    # A stores all 3 of its full blocks (the cap limits hits, not inserts), so A + C hits 3.
    assert expected_cached_tokens(requests, Unbounded(B, kind=kind)) == [0, 8, 12, 0, 24]


def test_radix_differs_from_hash_under_pressure_as_the_replay_says():
    requests = reqs(A, C, A + [1], C + [1], A[:8] + C)
    for kind in CacheKind:
        config = cache(4, kind=kind)
        expected = simulate(prepare_prompts(requests, B, keep_tokens=True), config).cached_tokens_per_request
        assert expected_cached_tokens(requests, config) == expected.tolist()


def test_request_order_is_the_replays_time_not_arrival():
    requests = [req(A + [1], 0, arrival_s=5.0), req(A, 1, arrival_s=1.0)]
    assert expected_cached_tokens(requests, Unbounded(B)) == [0, 8]  # the second is served second


def test_vllm_pool_model_counts_output_blocks_and_the_null_block():
    # 3 usable blocks; 8 prompt + 5 output - 1 = 12 tokens of KV fill them all (A0, A1, an output
    # block); then 9 + 4 - 1 = 12 again: A0 A1 hit (cap (9 - 1) // 4 = 2), the output block is popped.
    requests = [req(A[:8], 0, output=5), req(A[:8] + [9], 1, output=4)]
    pool = VllmPoolConfig(num_gpu_blocks=4, block_size=B)
    assert expected_cached_tokens(requests, pool) == [0, 8]
    assert expected_cached_tokens(requests, pool) == simulate_vllm(requests, pool).cached_tokens.tolist()
    salted = [
        req(A[:8], 0, salt=None, output=5),
        req(A[:8] + [9], 1, salt="", output=4),
        req(A[:8] + [9], 2, salt="t", output=4),
    ]
    assert expected_cached_tokens(salted, pool) == [0, 8, 0]  # None is the public namespace ""
    with pytest.raises(ValueError, match="output_tokens"):
        expected_cached_tokens(reqs(A), pool)
    with pytest.raises(TypeError):
        expected_cached_tokens(reqs(A), "unbounded")


@pytest.mark.parametrize("name", ["multi_prefix_zipf", "multi_prefix_rr"])
def test_agrees_with_simulate_on_a_scenario(name):
    scenario = load_scenario(SCENARIOS / f"{name}.toml")
    requests = scenario.workload_requests().requests[:300]
    for kind in CacheKind:
        trace = prepare_prompts(requests, 16, keep_tokens=kind is CacheKind.RADIX)
        with_outputs = prepare_prompts(
            requests, 16, keep_tokens=kind is CacheKind.RADIX, outputs=placeholder_outputs(requests)
        )
        for capacity in (64, 512):
            for order in ReleaseOrder if kind is CacheKind.HASH else (ReleaseOrder.TAIL_FIRST,):
                config = CacheConfig(capacity, 16, kind=kind, release_order=order, prompt_only=True)
                assert (
                    expected_cached_tokens(requests, config)
                    == simulate(trace, config).cached_tokens_per_request.tolist()
                )
                config = replace(config, prompt_only=False)  # the default: outputs stored too
                assert (
                    expected_cached_tokens(requests, config)
                    == simulate(with_outputs, config).cached_tokens_per_request.tolist()
                )
        unbounded = CacheConfig(
            unbounded_capacity_blocks((r.num_tokens for r in requests), 16), 16, kind=kind
        )
        assert (
            expected_cached_tokens(requests, Unbounded(16, kind=kind))
            == simulate(trace, unbounded).cached_tokens_per_request.tolist()
        )


def test_verify_tokens_keeps_token_bytes_and_changes_nothing_with_full_keys():
    requests = reqs(A + [1], A + [2], C + [1])
    assert (
        expected_cached_tokens(requests, cache(10, verify_tokens=True))
        == expected_cached_tokens(requests, cache(10))
        == [0, 12, 0]
    )


def test_unbounded_capacity_is_every_full_block_at_least_one():
    assert unbounded_capacity_blocks([12, 7, 3], B) == 3 + 1 + 0
    assert unbounded_capacity_blocks([3], B) == 1 and unbounded_capacity_blocks([], B) == 1
    with pytest.raises(ValueError):
        unbounded_capacity_blocks([4], 0)
    assert Unbounded(B).cache_config(reqs(A, A[:7])).capacity_blocks == 4
    with pytest.raises(ValueError):
        Unbounded(0)


def test_possible_bound_is_order_free():
    requests = reqs(A + [1], A + [2], C + [1], A + [3])
    prompts = prompt_blocks_of(requests, B)
    windows = [(0.0, 2.0), (1.0, 3.0), (4.0, 5.0), None]
    # 0 and 1 overlap: either could have been first, so both may hit 3 blocks; C shares nothing.
    assert possible_cached_tokens(prompts, windows) == [12, 12, 0, None]
    apart = [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0), (6.0, 7.0)]
    assert possible_cached_tokens(prompts, apart) == [0, 12, 0, 12]
