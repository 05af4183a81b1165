"""Generated blocks in the engine's cache (kvbench/engine/engine.py, step 6), against the simulator.

B06: block size 4, round 1 = an 8-token prompt that generates 5 tokens, round 2 = that prompt + the 5
generated ids + 4 new tokens. The engine stores every full block of 8 + 5 - 1 = 12 tokens, so round 2
gets 12 cached tokens (vLLM does the same); with ``prompt_only`` it gets 8.
"""

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.engine.engine import CopyConfig, HFEngine
from kvbench.engine.sampling import SamplingParams
from kvbench.request import Request
from kvbench.sim.outputs import record_outputs
from kvbench.sim.predict import expected_cached_tokens

B = 4
FIVE = SamplingParams(max_tokens=5, ignore_eos=True)


def engine(loaded, **cache_fields):
    return HFEngine(loaded, CopyConfig(cache=CacheConfig(capacity_blocks=64, block_size=B, **cache_fields)))


def two_rounds(engine: HFEngine, prompt: list[int], new: list[int]):
    first = engine.generate(prompt, FIVE)
    second_prompt = prompt + list(first.output_token_ids) + new
    return first, second_prompt, engine.generate(second_prompt, FIVE)


@pytest.mark.parametrize("kind", list(CacheKind))
def test_b06_round_two_hits_12_tokens_and_the_simulator_agrees(loaded, kind):
    prompt, new = list(range(10, 18)), [30, 31, 32, 33]
    on = engine(loaded, kind=kind)
    first, second_prompt, second = two_rounds(on, prompt, new)
    assert len(second_prompt) == 17 and first.output_tokens == 5
    assert first.num_inserted_blocks == 3  # (8 + 5 - 1) // 4: prompt blocks 0-1 and one output block
    assert second.cached_prompt_tokens == 12
    requests = [
        Request(i, f"r{i}", "chat", i, np.asarray(ids, dtype=np.uint32), max_tokens=5)
        for i, ids in enumerate((prompt, second_prompt))
    ]
    config = on.config.cache
    assert expected_cached_tokens(requests, config, record_outputs([first, second])) == [0, 12]
    on.cache.check_invariants()
    assert on.cache.num_evictable_blocks == on.cache.num_cached_blocks  # nothing left pinned

    off = HFEngine(loaded)  # cache off: the same outputs, token for token
    cold_first, cold_second = off.generate(prompt, FIVE), off.generate(second_prompt, FIVE)
    assert cold_first.output_token_ids == first.output_token_ids
    assert cold_second.output_token_ids == second.output_token_ids and cold_second.cached_prompt_tokens == 0


def test_prompt_only_keeps_the_old_behaviour(loaded):
    prompt_only = engine(loaded, prompt_only=True)
    first, second_prompt, second = two_rounds(prompt_only, list(range(10, 18)), [30, 31, 32, 33])
    assert first.num_inserted_blocks == 2 and second.cached_prompt_tokens == 8
    requests = [
        Request(i, f"r{i}", "chat", i, np.asarray(ids, dtype=np.uint32), max_tokens=5)
        for i, ids in enumerate((list(range(10, 18)), second_prompt))
    ]
    assert expected_cached_tokens(requests, prompt_only.config.cache, record_outputs([first, second])) == [
        0,
        8,
    ]


def test_generated_blocks_cost_capacity_as_the_prediction_says(loaded):
    """Before a run the output ids are unknown: the predictor's placeholders take the same room.

    5 blocks: P (12 tokens) stores 4 blocks (16 tokens of KV), Q (8) stores 3, evicting P's output
    block and P2 (tail first), so P + [5] hits 8; prompt-only stores 3 + 2 and P + [5] hits 12."""
    rng = np.random.default_rng(3)
    p, q = rng.integers(3, 1000, 12).tolist(), rng.integers(3, 1000, 8).tolist()
    prompts = [p, q, p + [5]]
    requests = [
        Request(i, f"r{i}", f"s{i}", 0, np.asarray(ids, dtype=np.uint32), max_tokens=5)
        for i, ids in enumerate(prompts)
    ]
    for prompt_only, hits in ((False, 8), (True, 12)):
        config = CacheConfig(capacity_blocks=5, block_size=B, prompt_only=prompt_only)
        on = HFEngine(loaded, CopyConfig(cache=config))
        cached = [on.generate(ids, FIVE).cached_prompt_tokens for ids in prompts]
        assert cached == expected_cached_tokens(requests, config) == [0, 0, hits]
        on.cache.check_invariants()
