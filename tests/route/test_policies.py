"""Routing policies on hand-made loads: the rules of round robin, hashing, bounded loads, SGLang's router."""

import numpy as np
import pytest

from kvbench.cache.block_hash import BlockHasher
from kvbench.request import Message, Request
from kvbench.route.approx_tree import ApproxTree, shared_prefix
from kvbench.route.cache_aware import CacheAware, CacheAwareConfig, is_imbalanced
from kvbench.route.furc import fbi_hash, murmur64a
from kvbench.route.policies import (
    ConsistentHash,
    HashRing,
    LeastLoaded,
    PowerOfTwo,
    PrefixHashBounded,
    RequestView,
    RoundRobin,
    SessionHash,
)
from kvbench.route.real_routers import SglangCacheAware, VllmCacheAware, routing_text

HASHER = BlockHasher(4)


def view(tokens, session="s", arrival_s=0.0):
    return RequestView(session, HASHER.prompt_blocks(tokens), arrival_s)


SHARED = list(range(40))  # 10 blocks of 4 tokens


def test_round_robin_and_least_loaded():
    router = RoundRobin(3)
    assert [router.choose(view(SHARED), [0, 0, 0]) for _ in range(5)] == [0, 1, 2, 0, 1]
    assert LeastLoaded().choose(view(SHARED), [3, 1, 1, 2]) == 1


def test_consistent_hashing_moves_few_sessions_when_a_replica_is_added():
    eight, nine = HashRing(8), HashRing(9)
    keys = [f"session-{i}".encode() for i in range(2000)]
    moved = sum(next(eight.walk(k)) != next(nine.walk(k)) for k in keys)
    assert 0.05 < moved / len(keys) < 0.2  # about 1/9 move, not 8/9 as with modulo hashing
    owners = [next(eight.walk(k)) for k in keys]
    assert min(owners.count(r) for r in range(8)) > 150  # 2000 / 8 = 250 each, roughly


def test_session_hash_is_sticky():
    router = SessionHash(8)
    first = router.choose(view(SHARED, "abc"), [0] * 8)
    assert all(router.choose(view(SHARED + [i], "abc"), [i] * 8) == first for i in range(10))


def test_bounded_loads_walk_the_ring_past_full_replicas():
    router = PrefixHashBounded(4, prefix_blocks=2, epsilon=0.5)
    owner = router.choose(view(SHARED), [0, 0, 0, 0])
    assert router.choose(view(SHARED[:8] + [99] * 8), [0, 0, 0, 0]) == owner  # same first 2 blocks
    loads = [0, 0, 0, 0]
    loads[owner] = 3  # bound = ceil(1.5 x (3 + 1) / 4) = 2: the owner is full
    second = router.choose(view(SHARED), loads)
    assert (
        second != owner
        and second == list(router.ring.walk(bytes(HASHER.prompt_blocks(SHARED).block_hashes[1])))[1]
    )


def test_imbalance_needs_both_thresholds():
    config = CacheAwareConfig()  # 64 and 1.5
    assert is_imbalanced([100, 30], config)  # 70 > 64 and 100 > 45
    assert not is_imbalanced([100, 70], config)  # 30 <= 64
    assert not is_imbalanced([200, 134], config)  # 66 > 64 but 200 <= 201


def primed(config=CacheAwareConfig()):
    router = CacheAware(4, 4, config)
    assert router.choose(view(SHARED), [0, 0, 0, 0]) == 0  # empty tree: the smallest tree, replica 0
    return router


def test_cache_aware_follows_the_longest_match_when_balanced():
    router = primed()
    assert router.choose(view(SHARED[:36] + [7] * 4), [10, 0, 3, 5]) == 0  # 36 / 40 = 0.9 > 0.3
    assert router.decisions == {"balance": 0, "match": 1, "smallest-tree": 1}


def test_cache_aware_goes_to_the_smallest_tree_below_the_threshold():
    router = primed()
    router.choose(view([500 + i for i in range(20)]), [0, 0, 0, 0])  # no match: smallest tree is 1
    assert router.tree.size_blocks == [10, 5, 0, 0]
    assert router.choose(view(SHARED[:8] + [9] * 32), [0, 0, 0, 0]) == 2  # 8 / 40 = 0.2 <= 0.3


def test_cache_aware_falls_back_to_the_least_loaded_when_imbalanced():
    router = primed()
    assert router.choose(view(SHARED), [100, 30, 0, 50]) == 2  # imbalanced: shortest queue, match ignored
    assert router.decisions["balance"] == 1
    # still recorded
    assert router.tree.owners[HASHER.prompt_blocks(SHARED).block_hashes[-1]].keys() == {
        0,
        2,
    }


def test_cache_aware_tree_eviction_drops_least_recently_used_leaves_first():
    router = primed(CacheAwareConfig(eviction_interval_s=10.0, max_tree_size_tokens=24))  # 6 blocks of 4
    router.choose(view(SHARED, arrival_s=1.0), [0, 0, 0, 0])
    router.choose(view([300] * 40, arrival_s=11.0), [0, 0, 0, 0])  # eviction runs first (t = 11 >= 10)
    keys = HASHER.prompt_blocks(SHARED).block_hashes
    assert router.tree.size_blocks[0] == 6
    assert all(0 in router.tree.owners[k] for k in keys[:6]) and not any(
        k in router.tree.owners for k in keys[6:]
    )


def test_cache_aware_config_is_validated():
    with pytest.raises(ValueError, match="cache_threshold"):
        CacheAwareConfig(cache_threshold=1.5)


def test_approx_tree_counts_characters_splits_edges_and_evicts_lru_leaves():
    tree = ApproxTree(3)
    tree.insert("hello world", 0, 1.0)
    tree.insert("hello there", 1, 2.0)
    tree.insert("apple", 2, 3.0)
    assert tree.sizes == [11, 11, 5]  # "hello " + "world" / "there": the split edge counts once each
    matched, node = tree.match("hello wo")
    assert (matched, sorted(node.tenants)) == (8, [0])  # a partial edge counts its shared characters
    assert sorted(tree.match("hello")[1].tenants) == [0, 1]
    assert tree.smallest() == [2]
    tree.evict(6)
    assert tree.sizes == [6, 6, 5]  # each drops its leaf, keeps the shared "hello "
    assert shared_prefix("abcdef", "abcxef") == 3 and shared_prefix("abc", "abc") == 3


def test_sglang_cache_aware_routes_on_character_match_rate():
    router = SglangCacheAware(2, CacheAwareConfig(cache_threshold=0.5))
    first = RequestView("s", HASHER.prompt_blocks(SHARED), 0.0, "system prompt. question one")
    assert router.choices(first, [0, 0]) == ([0, 1], "smallest-tree")  # empty trees: any worker
    router.commit(first, 1, "smallest-tree")
    same = RequestView("s", HASHER.prompt_blocks(SHARED), 1.0, "system prompt. question two")
    assert router.choose(same, [0, 0]) == 1  # 23 of 27 characters match > 0.5
    other = RequestView("t", HASHER.prompt_blocks(SHARED), 2.0, "a different text entirely")
    assert router.choose(other, [0, 0]) == 1  # no match: the smallest tree of the tenants (only 1)
    busy = RequestView("u", HASHER.prompt_blocks(SHARED), 3.0, "system prompt. question three")
    assert router.choose(busy, [100, 10]) == 1 and router.choose(busy, [100, 10]) == 1  # least loaded
    assert router.choose(busy, [10, 100]) == 0  # balance makes replica 0 a tenant
    assert router.choose(RequestView("v", HASHER.prompt_blocks(SHARED), 4.0, "zzz"), [0, 0]) == 0  # smaller


def test_vllm_cache_aware_starts_with_every_replica_a_tenant():
    router = VllmCacheAware(2, CacheAwareConfig(cache_threshold=0.5))
    tokens = HASHER.prompt_blocks(SHARED)
    first = RequestView("s", tokens, 0.0, "", np.arange(100, dtype=np.uint32))
    assert router.choose(first, [0, 0]) == 0
    other = RequestView("t", tokens, 1.0, "", np.arange(500, 600, dtype=np.uint32))
    assert router.choose(other, [0, 0]) == 1  # no token in common: the empty tree
    again = RequestView("s", tokens, 2.0, "", np.arange(120, dtype=np.uint32))
    assert router.choices(again, [0, 0]) == ([0], "match")  # 100 of 120 tokens


def test_vllm_ring_hash_and_consistent_hash_are_deterministic():
    assert murmur64a(b"", 0) == 0  # the empty key with seed 0 mixes to 0
    assert fbi_hash("http://127.0.0.1:8001:0") == 0x0667EBC6C13D00C2  # pinned from this code
    urls = ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
    router = ConsistentHash(urls)
    owners = {router.choose(view(SHARED, f"session-{i}"), [0, 0]) for i in range(50)}
    assert owners == {0, 1}
    assert router.choose(view(SHARED, "abc"), [0, 0]) == router.choose(view([1, 2], "abc"), [5, 0])


def test_power_of_two_takes_the_less_loaded_of_two_draws():
    router = PowerOfTwo(2, seed=1)
    assert all(router.choose(view(SHARED), [3, 1]) == 1 for _ in range(20))  # n = 2: both drawn


def test_routing_text_joins_message_contents_as_sglang_router_does():
    messages = (
        Message("system", "Be brief."),
        Message("user", "Hi"),
        Message("assistant", "  Hello!  "),
        Message("assistant", "   "),
        Message("user", "Why?"),
    )
    chat = Request(0, "r0", "s", 0, np.arange(3, dtype=np.uint32), messages=messages)
    assert routing_text(chat) == "Be brief. Hi Hello! Why?"  # assistant stripped, an empty one skipped
    assert routing_text(Request(1, "r1", "s", 0, np.arange(3, dtype=np.uint32), prompt="p q")) == "p q"
    assert routing_text(Request(2, "r2", "s", 0, np.array([7, 42], dtype=np.uint32))) == "7 42"
