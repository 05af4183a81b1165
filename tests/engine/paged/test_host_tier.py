"""The paged engine's host KV tier (``--host-tier``): at concurrency 1 it serves exactly what the
simulator's inclusive tier says, request by request; loaded blocks give the outputs the cache-off
engine gives; the tier's slots stay consistent."""

import numpy as np
import pytest
from tiny_workloads import numbered_requests

from kvbench.cache.base import CacheConfig
from kvbench.cache.host_tier import HostTierIndex
from kvbench.engine.engine import HFEngine
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.sampling import SamplingParams
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.stack_distance import stack_distances
from kvbench.sim.tiers import Tier, TierPolicy, tier_split

pytestmark = pytest.mark.engine
BLOCK = 16


def ids(seed, n):
    return np.random.default_rng(seed).integers(3, 1000, n).tolist()


def rotating_prompts(num_prefixes=3, num_requests=12):
    """Three 4-block system prompts in turn, each request with its own 5-token question (no prompt is
    a whole number of blocks: each holds a partly filled block while it runs)."""
    prefixes = [ids(100 + p, 4 * BLOCK) for p in range(num_prefixes)]
    return [prefixes[i % num_prefixes] + ids(i, 5) for i in range(num_requests)]


def engine_of(loaded, pool_blocks, host_blocks):
    return PagedEngine(loaded, PagedConfig(CacheConfig(pool_blocks, BLOCK), host_tier_blocks=host_blocks))


@pytest.mark.parametrize("host_blocks, host_hit_blocks", [(24, 9 * 4), (10, 9 * 2), (3, 0)])
def test_at_concurrency_1_the_engine_serves_what_the_simulator_predicts(loaded, host_blocks, host_hit_blocks):
    prompts = rotating_prompts()
    # 6 pool blocks: one 4-block system prompt and a question at a time
    engine = engine_of(loaded, 6, host_blocks)
    records = [engine.generate(p, SamplingParams(max_tokens=1, ignore_eos=True)) for p in prompts]
    engine.check_invariants()
    trace = prepare_prompts(numbered_requests(prompts), BLOCK)
    # the pool of 6 holds 5 keyed blocks between requests: each request runs with one partly filled block
    split = tier_split(
        stack_distances(trace.prompts),
        5,
        (Tier("host", host_blocks, 25e9),),
        TierPolicy.INCLUSIVE,
        BLOCK,
        np.array([len(p) for p in prompts]),
    )
    assert [r.host_cached_tokens for r in records] == split.hit_tokens[1].tolist()
    assert [r.cached_prompt_tokens for r in records] == split.hit_tokens.sum(axis=0).tolist()
    # 24: every system prompt after the first round; 10: the two oldest blocks of the next prompt (block 0
    # ends most recent: tail first); 3 < the pool: an inclusive tier no larger than the GPU adds nothing
    assert sum(r.host_cached_tokens for r in records) == host_hit_blocks * BLOCK


def test_without_the_tier_the_same_traffic_hits_nothing(loaded):
    engine = PagedEngine(loaded, PagedConfig(CacheConfig(6, BLOCK)))
    records = [engine.generate(p, SamplingParams(max_tokens=1, ignore_eos=True)) for p in rotating_prompts()]
    assert [r.cached_prompt_tokens for r in records] == [0] * 12 and records[0].host_cached_tokens is None


def test_blocks_loaded_from_the_tier_give_the_cache_off_outputs(loaded):
    prompts = rotating_prompts(num_requests=6)
    engine, off = engine_of(loaded, 6, 24), HFEngine(loaded)
    sampling = SamplingParams(max_tokens=6, ignore_eos=True)
    for prompt in prompts:
        record = engine.generate(prompt, sampling)
        assert record.output_token_ids == off.generate(prompt, sampling).output_token_ids
    assert record.host_cached_tokens == 4 * BLOCK
    engine.reset_prefix_cache()
    assert engine.generate(prompts[0], SamplingParams(max_tokens=1)).cached_prompt_tokens == 0


def test_the_tier_is_refused_without_the_hash_cache(loaded):
    with pytest.raises(ValueError, match="--host-tier needs the hash prefix cache"):
        PagedConfig(CacheConfig(6, BLOCK), prefix_caching=False, host_tier_blocks=8)


def test_the_index_hands_out_each_slot_once_and_drops_the_least_recent():
    index = HostTierIndex(2)
    assert (index.store("a"), index.store("b"), index.store("a")) == (0, 1, None)  # "a" refreshed
    assert index.store("c") == 1 and index.cached_prefix(["a", "c", "b"]) == [0, 1]  # "b" was least recent
    index.check_invariants()
    assert index.num_evicted_blocks == 1
