"""Truncated keys collide; the hash cache trusts its key unless verify_tokens is on."""

import itertools

from kvbench.cache.base import CacheConfig, make_cache
from kvbench.cache.block_hash import BlockHasher, HashConfig


def colliding_pair(hasher):
    """Two different one-block prompts whose first keys are equal."""
    seen = {}
    for token in itertools.count():
        key = hasher.block_hashes([token, token + 1])[0]
        if key in seen:
            return [seen[key], seen[key] + 1], [token, token + 1]
        seen[key] = token


def test_a_collision_is_a_false_hit_without_the_guard():
    config = CacheConfig(capacity_blocks=10, block_size=2, hash=HashConfig(hash_bits=8))
    hasher = BlockHasher(2, config.hash)
    first, second = colliding_pair(hasher)
    cache = make_cache(config)
    prompt = hasher.prompt_blocks(first)
    cache.release(cache.insert(prompt, 0, payloads=["kv of first"]).handles)
    match = cache.lookup(hasher.prompt_blocks(second))
    assert match.num_hit_blocks == 1 and match.payloads == ["kv of first"]  # wrong KV served
    cache.release(match.handles)


def test_verify_tokens_rejects_the_collision():
    config = CacheConfig(capacity_blocks=10, block_size=2, hash=HashConfig(hash_bits=8), verify_tokens=True)
    hasher = BlockHasher(2, config.hash)
    first, second = colliding_pair(hasher)
    cache = make_cache(config)
    cache.release(cache.insert(hasher.prompt_blocks(first), 0).handles)
    match = cache.lookup(hasher.prompt_blocks(second))
    assert match.num_hit_blocks == 0 and cache.stats.num_rejected_hits == 1
    cache.release(match.handles)
    again = cache.lookup(hasher.prompt_blocks(first))
    assert again.num_hit_blocks == 1  # the guard does not hurt true hits
    cache.release(again.handles)


def test_radix_cache_compares_tokens_so_it_cannot_collide():
    config = CacheConfig(capacity_blocks=10, block_size=2, kind="radix")
    hasher = BlockHasher(2, HashConfig(hash_bits=8))
    first, second = colliding_pair(hasher)
    cache = make_cache(config)
    cache.release(cache.insert(hasher.prompt_blocks(first), 0).handles)
    match = cache.lookup(hasher.prompt_blocks(second))
    assert match.num_hit_blocks == 0
    cache.release(match.handles)


def test_radix_split_keeps_both_branches():
    config = CacheConfig(capacity_blocks=20, block_size=2, kind="radix")
    hasher = BlockHasher(2)
    cache = make_cache(config)
    long = hasher.prompt_blocks(list(range(10)))
    cache.release(cache.insert(long, 0, payloads=list("abcde")).handles)
    branch = hasher.prompt_blocks([0, 1, 2, 3, 9, 9])
    match = cache.lookup(branch)
    assert match.num_hit_blocks == 2 and match.payloads == ["a", "b"]
    new = cache.insert(branch, 2, payloads=["z"])
    cache.release(match.handles + new.handles)
    cache.check_invariants()
    for prompt, expected in ((long, list("abcde")), (branch, ["a", "b", "z"])):
        match = cache.lookup(prompt)
        assert match.payloads == expected
        cache.release(match.handles)
    assert cache.num_cached_blocks == 6
    cache.check_invariants()
