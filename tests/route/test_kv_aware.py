"""``kv_aware``: routing on what each replica's cache holds, read through the caches' block events."""

import numpy as np
import pytest

from kvbench.cache.base import CacheConfig, CacheKind, make_cache
from kvbench.cache.block_hash import BlockHasher
from kvbench.errors import InputError
from kvbench.events.blockmap import content_key, prompt_content_keys
from kvbench.request import Request
from kvbench.route.api import compare_policies, make_router, policies_for
from kvbench.route.cache_aware import CacheAware
from kvbench.route.cluster import ClusterConfig, prepare_route_trace, simulate_cluster
from kvbench.route.kv_aware import HELD, NO_HIT, SHORT, KvAware
from kvbench.route.policies import PolicyName, RequestView
from kvbench.route.service import ServiceModel
from kvbench.sim.step import step

BLOCK = 4
HASHER = BlockHasher(BLOCK)
P = list(range(1, 9))  # two blocks
Q = list(range(101, 109))  # two blocks, another prefix
R = list(range(201, 217))  # four blocks


def view(tokens, arrival_s=0.0):
    return RequestView("s", HASHER.prompt_blocks(tokens), arrival_s)


def replicas(capacity_blocks=8, count=3):
    """``count`` real hash caches behind a fresh :class:`KvAware` listening to them."""
    caches = [make_cache(CacheConfig(capacity_blocks, BLOCK)) for _ in range(count)]
    router = KvAware(count, BLOCK)
    router.attach(caches)
    return router, caches


def serve(cache, tokens):
    return step(cache, HASHER.prompt_blocks(tokens)).num_hit_blocks


def test_request_keys_are_the_keys_the_block_map_gives_the_stored_events():
    prompt = HASHER.prompt_blocks(P + [9])
    first = content_key(None, (1, 2, 3, 4), None)
    assert prompt_content_keys(prompt.block_tokens) == [first, content_key(first, (5, 6, 7, 8), None)]
    router, caches = replicas()
    serve(caches[1], P + [9])
    assert router.scores(view(P + [42])) == [0, 2, 0]


def test_the_longest_held_prefix_wins_a_tie_goes_to_the_least_loaded_then_the_first():
    router, caches = replicas()
    serve(caches[0], P + Q + [0])  # replica 0: P, then Q's blocks after P (4 blocks)
    serve(caches[1], Q + [0])  # replica 1: Q from block 0
    serve(caches[2], P + [0])  # replica 2: P (2 blocks)
    assert router.scores(view(P + Q + [7])) == [4, 0, 2]
    assert router.choose(view(P + Q + [7]), [5, 0, 0]) == 0  # held prefix first, whatever the load
    assert router.scores(view(P + R)) == [2, 0, 2]
    assert router.choose(view(P + R), [0, 0, 0]) == 0  # equal scores and loads: the first (0.1.17)
    assert router.choose(view(P + R), [3, 0, 1]) == 2  # equal scores: the less loaded
    assert router.choose(view(Q + R), [0, 0, 0]) == 1
    assert router.choose(view(R), [2, 1, 1]) == 1  # held nowhere: least loaded, the first of equals
    assert router.choose(view([1, 2, 3]), [3, 2, 2]) == 1  # under one block: least loaded
    assert router.decisions == {HELD: 4, NO_HIT: 1, SHORT: 1}


def test_an_eviction_drops_the_replicas_score_where_a_history_based_router_still_goes():
    router, caches = replicas(capacity_blocks=4)
    history = CacheAware(3, BLOCK)
    serve(caches[0], P + Q + [0])  # replica 0 full: P then Q's blocks after P
    serve(caches[2], P[:4] + [0])  # replica 2: P's first block
    assert router.choose(view(P + [7]), [0, 0, 0]) == 0  # 2 blocks there, 1 on replica 2
    assert history.choose(view(P + [7]), [0, 0, 0]) == 0  # its tree now says replica 0 holds P
    serve(caches[0], R + [0])  # four new blocks evict everything replica 0 held
    assert router.scores(view(P + [7])) == [0, 0, 1]
    assert router.choose(view(P + [7]), [0, 0, 0]) == 2  # the replica that still holds block 0
    assert history.choose(view(P + [7]), [0, 0, 0]) == 0  # history cannot see the eviction
    caches[2].reset()  # AllBlocksCleared
    assert router.scores(view(P + [7])) == [0, 0, 0]


def request(index, tokens, arrival_s):
    ids = np.array(tokens, dtype=np.uint32)
    return Request(index, f"r{index}", f"s{index}", 0, ids, arrival_s, max_tokens=2, output_tokens=2)


def test_simulated_replicas_feed_the_router_through_their_events():
    """Three replicas of 4 blocks, each request in service for 1 s (its second token): a no-hit request
    goes to the least loaded replica, P's second turn follows P to the busy replica 0, and once R has
    evicted P there the next P goes to the least loaded replica (1: replica 0 is busy with R)."""
    tokens = [P + [90], Q + [91], P + [92], R + [93], P + [94]]
    arrivals = [0.0, 0.1, 0.2, 5.0, 5.5]
    trace = prepare_route_trace(
        [request(i, t, a) for i, (t, a) in enumerate(zip(tokens, arrivals))],
        CacheConfig(4, BLOCK),
        keep_tokens=True,
    )
    service = ServiceModel(prefill_base_ms=0.0, prefill_ms_per_token=0.0, decode_ms_per_token=1000.0)
    config = ClusterConfig(3, CacheConfig(4, BLOCK), service)
    run = simulate_cluster(trace, make_router("kv_aware", 3, BLOCK), config)
    assert run.replica.tolist() == [0, 1, 0, 0, 1]
    assert run.cached_tokens.tolist() == [0, 0, 8, 0, 0]


def test_kv_aware_replica_hits_equal_a_single_cache_replay_of_what_it_received(chat8):
    cache = CacheConfig(300, 16)
    trace = prepare_route_trace(chat8, cache, keep_tokens=True)
    (result,) = compare_policies(trace, ClusterConfig(4, cache), ["kv_aware"])
    run = result.run
    for replica in range(4):
        single = make_cache(cache)
        mine = [i for i in range(trace.num_requests) if run.replica[i] == replica]
        hits = [step(single, trace.prompts[i]).num_hit_blocks * 16 for i in mine]
        assert hits == run.cached_tokens[mine].tolist()
    assert result.decisions[HELD] > result.decisions[NO_HIT] > 0


def test_kv_aware_needs_a_cache_that_publishes_block_events_and_the_prompts_tokens():
    radix = CacheConfig(64, BLOCK, kind=CacheKind.RADIX)
    assert PolicyName.KV_AWARE in policies_for(CacheConfig(64, BLOCK))
    assert PolicyName.KV_AWARE not in policies_for(radix)
    with pytest.raises(InputError, match="publishes none"):
        KvAware(1, BLOCK).attach([make_cache(radix)])
    router, _ = replicas(count=1)
    bare = RequestView("s", HASHER.prompt_blocks(P, keep_tokens=False), 0.0)
    with pytest.raises(ValueError, match="keep_tokens"):
        router.choose(bare, [0])
