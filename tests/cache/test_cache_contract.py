"""The prefix-cache contract, run against both caches (hash table and radix tree)."""

import pytest

from kvbench.cache.block_hash import BlockHasher
from kvbench.errors import CacheBusyError


def serve(cache, prompt, max_hit_blocks=None, payloads=None):
    """One request's life: lookup, insert the rest, release. Returns blocks hit."""
    match = cache.lookup(prompt, max_hit_blocks)
    new = cache.insert(prompt, match.num_hit_blocks, payloads[match.num_hit_blocks :] if payloads else None)
    cache.release(match.handles + new.handles)
    cache.check_invariants()
    return match.num_hit_blocks


def hits(cache, prompt, max_hit_blocks=None):
    """Blocks a lookup hits now (released again at once)."""
    match = cache.lookup(prompt, max_hit_blocks)
    cache.release(match.handles)
    cache.check_invariants()
    return match.num_hit_blocks


def test_fill_then_hit_then_diverge(build):
    cache, hasher, _ = build(capacity_blocks=10)
    tokens = list(range(12))
    assert serve(cache, hasher.prompt_blocks(tokens)) == 0
    assert serve(cache, hasher.prompt_blocks(tokens)) == 3
    assert serve(cache, hasher.prompt_blocks(list(range(8)) + [99] * 4)) == 2
    assert cache.stats.num_lookups == 3 and cache.stats.num_hit_blocks == 5
    assert cache.stats.num_inserted_blocks == 4  # 3 for the first prompt, 1 for the diverging block


def test_last_token_cap(build):
    cache, hasher, _ = build(capacity_blocks=10)
    prompt = hasher.prompt_blocks(list(range(12)))
    serve(cache, prompt)
    assert hits(cache, prompt, prompt.max_hit_blocks) == 2  # (12 - 1) // 4


def test_insert_is_refused_when_everything_is_pinned(build):
    cache, hasher, _ = build(capacity_blocks=2)
    first = hasher.prompt_blocks(list(range(8)))
    pinned = cache.insert(first, 0)  # never released
    assert pinned.num_inserted_blocks == 2
    third = cache.insert(hasher.prompt_blocks([50, 51, 52, 53]), 0)
    assert not third
    assert third.num_refused_blocks == 1 and cache.stats.num_refused_blocks == 1
    assert cache.num_cached_blocks == 2 and cache.stats.num_evicted_blocks == 0
    cache.release(third.handles)
    cache.check_invariants()
    again = cache.lookup(first)
    assert again.num_hit_blocks == 2  # both pinned blocks survived
    cache.release(again.handles + pinned.handles)
    cache.check_invariants()


def test_lru_evicts_the_chains_last_block_first(build):
    cache, hasher, _ = build(capacity_blocks=3)
    chain = hasher.prompt_blocks(list(range(12)))
    serve(cache, chain)
    serve(cache, hasher.prompt_blocks([70, 71, 72, 73]))
    assert cache.stats.num_evicted_blocks == 1
    assert hits(cache, chain) == 2  # the first two remain; the tail was the victim


def test_an_insert_says_how_many_blocks_it_evicted(build):
    cache, hasher, _ = build(capacity_blocks=3)
    first = cache.insert(hasher.prompt_blocks(list(range(12))), 0)
    cache.release(first.handles)
    assert first.num_evicted_blocks == 0
    second = cache.insert(hasher.prompt_blocks(list(range(50, 58))), 0)
    cache.release(second.handles)
    cache.check_invariants()
    assert second.num_evicted_blocks == 2 == cache.stats.num_evicted_blocks


def test_head_first_release_orphans_the_chain():
    from kvbench.cache.base import CacheConfig, make_cache

    cache = make_cache(CacheConfig(capacity_blocks=3, block_size=4, release_order="head-first"))
    hasher = BlockHasher(4)
    chain = hasher.prompt_blocks(list(range(12)))
    serve(cache, chain)
    serve(cache, hasher.prompt_blocks([70, 71, 72, 73]))
    assert hits(cache, chain) == 0  # the head went first: the two surviving blocks are unreachable
    assert cache.num_cached_blocks == 3


def test_radix_refuses_head_first():
    from kvbench.cache.base import CacheConfig, make_cache

    with pytest.raises(ValueError, match="head-first"):
        make_cache(CacheConfig(capacity_blocks=3, kind="radix", release_order="head-first"))


def test_ttl_expires_idle_blocks_and_hits_refresh_the_timer(build):
    cache, hasher, clock = build(capacity_blocks=10, ttl_s=300)
    prompt = hasher.prompt_blocks(list(range(8)))
    serve(cache, prompt)  # t = 0
    clock.now_s = 200
    assert hits(cache, prompt) == 2  # idle 200 s; the timer restarts
    clock.now_s = 450
    assert hits(cache, prompt) == 2  # idle 250 s since the hit at 200
    clock.now_s = 800
    assert hits(cache, prompt) == 0  # idle 350 s
    assert cache.stats.num_expired_blocks == 2 and cache.num_cached_blocks == 0


def test_pinned_blocks_never_expire(build):
    cache, hasher, clock = build(capacity_blocks=10, ttl_s=10)
    prompt = hasher.prompt_blocks(list(range(8)))
    held = cache.insert(prompt, 0)
    clock.now_s = 1000
    assert cache.sweep() == 0 and cache.num_cached_blocks == 2
    cache.release(held.handles)
    clock.now_s = 1011
    assert cache.sweep() == 2


@pytest.mark.parametrize("separate", [{"salt": "a"}, {"extra_keys": ["lora-1"]}])
def test_salts_and_extra_keys_never_share_blocks(build, separate):
    cache, hasher, _ = build(capacity_blocks=10)
    tokens = list(range(8))
    serve(cache, hasher.prompt_blocks(tokens))
    assert hits(cache, hasher.prompt_blocks(tokens, **separate)) == 0
    serve(cache, hasher.prompt_blocks(tokens, **separate))
    assert hits(cache, hasher.prompt_blocks(tokens, **separate)) == 2
    other = {k: (["lora-2"] if k == "extra_keys" else "b") for k in separate}
    assert hits(cache, hasher.prompt_blocks(tokens, **other)) == 0


def test_a_hit_on_a_free_block_pins_it_again(build):
    cache, hasher, _ = build(capacity_blocks=2)
    prompt = hasher.prompt_blocks(list(range(8)))
    serve(cache, prompt)
    assert cache.num_evictable_blocks == 2
    match = cache.lookup(prompt)
    assert match.num_hit_blocks == 2 and cache.num_evictable_blocks == 0
    refused = cache.insert(hasher.prompt_blocks([60, 61, 62, 63]), 0)
    assert not refused and cache.stats.num_evicted_blocks == 0  # the revived blocks are safe
    cache.release(match.handles + refused.handles)
    assert cache.num_evictable_blocks == 2
    cache.check_invariants()


def test_payloads_come_back_in_block_order(build):
    cache, hasher, _ = build(capacity_blocks=10)
    prompt = hasher.prompt_blocks(list(range(12)))
    serve(cache, prompt, payloads=["p0", "p1", "p2"])
    other = hasher.prompt_blocks(list(range(8)) + [7, 7, 7, 7])
    serve(cache, other, payloads=["x0", "x1", "q2"])  # shares two blocks, adds one
    match = cache.lookup(prompt)
    assert match.payloads == ["p0", "p1", "p2"]
    cache.release(match.handles)
    match = cache.lookup(other)
    assert match.payloads == ["p0", "p1", "q2"]
    cache.release(match.handles)
    cache.check_invariants()


def test_concurrent_requests_share_blocks_and_ref_counts(build):
    cache, hasher, _ = build(capacity_blocks=10)
    prompt = hasher.prompt_blocks(list(range(12)))
    serve(cache, prompt)
    first, second = cache.lookup(prompt), cache.lookup(prompt)
    assert first.num_hit_blocks == second.num_hit_blocks == 3
    cache.release(first.handles)
    assert cache.num_evictable_blocks == 0  # still pinned by the second request
    cache.release(second.handles)
    assert cache.num_evictable_blocks == 3
    cache.check_invariants()


def test_insert_shares_blocks_another_request_stored_meanwhile(build):
    cache, hasher, _ = build(capacity_blocks=10)
    prompt = hasher.prompt_blocks(list(range(12)))
    first, second = cache.lookup(prompt), cache.lookup(prompt)  # both miss
    stored = cache.insert(prompt, 0)
    shared = cache.insert(prompt, 0)
    assert stored.num_inserted_blocks == 3
    assert shared.num_inserted_blocks == 0 and shared.num_existing_blocks == 3
    assert cache.num_cached_blocks == 3
    cache.release(first.handles + stored.handles)
    cache.release(second.handles + shared.handles)
    assert cache.num_evictable_blocks == 3
    cache.check_invariants()


def test_double_release_is_an_error(build):
    cache, hasher, _ = build(capacity_blocks=10)
    new = cache.insert(hasher.prompt_blocks(list(range(8))), 0)
    cache.release(new.handles)
    with pytest.raises(ValueError, match="released more often"):
        cache.release(new.handles)


def test_reset_refuses_while_pinned_and_clears_when_idle(build):
    cache, hasher, _ = build(capacity_blocks=10)
    prompt = hasher.prompt_blocks(list(range(8)))
    held = cache.insert(prompt, 0)
    with pytest.raises(CacheBusyError):
        cache.reset()
    cache.release(held.handles)
    cache.reset()
    assert cache.num_cached_blocks == 0 and hits(cache, prompt) == 0


def test_insert_range_is_validated(build):
    cache, hasher, _ = build(capacity_blocks=10)
    prompt = hasher.prompt_blocks(list(range(8)))
    with pytest.raises(ValueError):
        cache.insert(prompt, 3)
    with pytest.raises(ValueError):
        cache.insert(prompt, 0, payloads=["only one"])
