"""The vLLM-faithful simulator (kvbench/sim/vllm_pool.py): one hand-made trace per rule.

Block size 4 throughout; token ids are small ints, so a block is a run of four numbers. ``usable``
below is the pool minus vLLM's null block.
"""

import numpy as np
import pytest

from kvbench.request import Request
from kvbench.sim.vllm_pool import VllmPoolConfig, VllmSimulator, simulate_vllm

B = 4


def req(tokens, output=1, salt=""):
    return Request(0, "r", "s", 0, np.asarray(tokens, dtype=np.uint32), salt=salt, output_tokens=output)


def simulator(num_usable_blocks):
    return VllmSimulator(VllmPoolConfig(num_gpu_blocks=num_usable_blocks + 1, block_size=B))


A = list(range(100, 112))  # three blocks: A0 A1 A2
X = [7, 7, 7, 7]


def test_config_validates_and_counts_the_null_block():
    assert VllmPoolConfig(num_gpu_blocks=10, block_size=32).num_usable_blocks == 9
    for bad in (
        dict(num_gpu_blocks=1),
        dict(num_gpu_blocks=0),
        dict(num_gpu_blocks=8, block_size=0),
        dict(num_gpu_blocks=True),
    ):
        with pytest.raises(ValueError):
            VllmPoolConfig(**bad)


def test_rule1_capacity_is_the_pool_minus_the_null_block():
    simulator(3).run(req(A))  # 12 tokens of KV: 3 blocks fit in 3 usable blocks
    with pytest.raises(ValueError, match="needs 4 blocks"):
        simulator(3).run(req(A + [1]))  # 13 tokens of KV: 4 blocks


def test_rule2_output_tokens_hold_blocks_while_running():
    simulator(3).run(req(A[:8], output=5))  # KV of 8 + 5 - 1 = 12 tokens: 3 blocks
    with pytest.raises(ValueError, match="needs 4 blocks"):
        simulator(3).run(req(A[:8], output=6))  # 13 tokens: the output needs a 4th block


def test_rule3_full_output_blocks_are_cached_up_to_prompt_plus_output_minus_one():
    output = [50, 51, 52, 53, 54]
    for num_output, expected in ((4, 8), (5, 12)):
        sim = simulator(8)
        sim.run(req(A[:8], output=num_output), output_token_ids=output[:num_output])
        follow_up = A[:8] + output[:num_output] + [60, 61, 62, 63]
        # 4 outputs: KV of 11 tokens, block 2 (8..11) is not full -> only 2 blocks cached.
        # 5 outputs: KV of 12 tokens, block 2 is full and cached -> 3 blocks hit.
        assert sim.run(req(follow_up)) == expected


def test_rule3_unknown_output_blocks_never_hit():
    sim = simulator(8)
    sim.run(req(A[:8], output=8))  # KV of 15 tokens: blocks 2 (output) cached under a unique key
    assert sim.run(req(A[:8] + [50, 51, 52, 53, 54])) == 8


def test_rule4_hit_capped_at_prompt_minus_one_and_floored_to_blocks():
    sim = simulator(8)
    assert sim.run(req(A[:8])) == 0
    assert sim.run(req(A[:8])) == 4  # identical 8-token prompt: (8 - 1) // 4 = 1 block
    assert sim.run(req(A[:9])) == 8
    assert sim.run(req(A[:7])) == 4
    assert sim.run(req(A[:3])) == 0


def test_rule4_lookup_stops_at_the_first_miss():
    sim = simulator(8)
    sim.run(req(A))
    changed = A[:4] + [0] + A[5:] + [1]  # block 1 differs, so block 2's chained key differs too
    assert sim.run(req(changed)) == 4


def test_rule5_free_is_tail_first_so_the_tail_is_evicted_first():
    sim = simulator(3)
    sim.run(req(A))  # 3 cached blocks; free queue A2, A1, A0
    sim.run(req(X))  # needs one block: evicts A2, the tail
    assert sim.run(req(A[:9])) == 8  # A0 A1 still hit (head first would have evicted A0: 0 hits)


def test_rule5_unhashed_blocks_go_to_the_front_of_the_free_queue():
    sim = simulator(3)
    sim.run(req(X))  # X0 cached (block 1); queue: 2, 3, 1
    sim.run(req(A[:6]))  # blocks 2 (A0, cached) and 3 (partial tail): queue 3, 1(X0), 2(A0)
    sim.run(req([9, 9, 9, 9]))  # pops the partial block 3, evicting nothing
    assert sim.pool.num_evicted_blocks == 0
    assert sim.run(req(X + [1])) == 4  # X0 survived; appending the partial block would have evicted it


def test_rule6_free_cached_blocks_hit_until_popped_and_are_touched_before_allocation():
    sim = simulator(2)
    sim.run(req(A[:8]))  # A0 A1 cached, both free; queue A1, A0
    # 7 tokens: hits A0 (cap 1 block) and needs 1 new block of 2 usable: the hit leaves the queue first,
    # so the new block is A1's, not A0's.
    assert sim.run(req(A[:4] + [1, 2, 3])) == 4
    assert sim.pool.num_evicted_blocks == 1
    assert sim.pool.num_cached_blocks == 1  # only A0 is left (the 7-token request's own tail is partial)
    assert sim.run(req(A[:4] + [5])) == 4


def test_rule7_salt_is_a_namespace():
    sim = simulator(8)
    sim.run(req(A, salt="tenant-a"))
    assert sim.run(req(A + [1], salt="tenant-b")) == 0
    assert sim.run(req(A + [1], salt="tenant-a")) == 12
    assert sim.run(req(A + [1])) == 0


def test_rule8_counters_and_result():
    requests = [req(A[:8]), req(A[:9]), req(X + X + [1], output=3)]
    result = simulate_vllm(requests, VllmPoolConfig(num_gpu_blocks=9, block_size=B))
    assert result.cached_tokens.tolist() == [0, 8, 0]
    assert result.prefix_cache_queries_tokens == 8 + 9 + 9
    assert result.prefix_cache_hits_tokens == 8
    assert result.token_hit_rate == pytest.approx(8 / 26)


def test_output_length_is_required():
    with pytest.raises(ValueError, match="output_tokens"):
        simulator(4).run(Request(0, "r", "s", 0, np.asarray(A, dtype=np.uint32)))


def test_shared_prefix_matches_the_observed_server_numbers():
    """Seen on a vLLM server: 2,348-token prompts sharing 2,340 tokens, block 32 -> 0, 2336, 2336, 2336."""
    rng = np.random.default_rng(0)
    system = rng.integers(0, 100_000, 2340)
    requests = [req(np.concatenate((system, rng.integers(0, 100_000, 8))), output=16) for _ in range(4)]
    result = simulate_vllm(requests, VllmPoolConfig(num_gpu_blocks=2000, block_size=32))
    assert result.cached_tokens.tolist() == [0, 2336, 2336, 2336]


def test_random_traces_keep_the_pool_consistent():
    rng = np.random.default_rng(1)
    prefixes = [rng.integers(0, 50, 12) for _ in range(3)]
    sim = simulator(12)
    for _ in range(300):
        tail = rng.integers(0, 50, int(rng.integers(1, 10)))
        tokens = np.concatenate((prefixes[int(rng.integers(0, 3))][: int(rng.integers(0, 13))], tail))
        prompt = req(tokens, output=int(rng.integers(1, 12)), salt=str(rng.integers(0, 2)))
        cached = sim.run(prompt)
        assert cached % B == 0 and cached <= (len(tokens) - 1) // B * B
        sim.pool.check_invariants()
