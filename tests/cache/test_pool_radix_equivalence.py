"""The pool's radix kind evicts exactly as the radix cache does (LRU unpinned leaf, trimmed from its
tail; TTL from the leaves up): the same random lookups, inserts, releases and time steps give the same
hits, inserts, refusals, evictions and expiries on both (kvbench.cache.block_index's argument)."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvbench.cache.base import CacheConfig, make_cache
from kvbench.cache.block_hash import BlockHasher
from kvbench.cache.pool_cache import PoolPrefixCache

BLOCK_SIZE = 2
token_lists = st.lists(st.integers(0, 2), min_size=0, max_size=12)


class SideBySide(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.now_s = 0.0
        self.hasher = BlockHasher(BLOCK_SIZE)
        self.active = []  # (tree handles, pool handles)

    @initialize(capacity=st.integers(1, 12), ttl_s=st.sampled_from([None, 5.0]))
    def build(self, capacity, ttl_s):
        config = CacheConfig(capacity_blocks=capacity, block_size=BLOCK_SIZE, kind="radix", ttl_s=ttl_s)
        self.tree = make_cache(config, clock=lambda: self.now_s)
        self.pool = PoolPrefixCache(config, clock=lambda: self.now_s)

    @rule(
        tokens=token_lists,
        cap=st.one_of(st.none(), st.integers(0, 6)),
        salt=st.sampled_from(["", "t"]),
        stop_short=st.integers(0, 2),
    )
    def start_request(self, tokens, cap, salt, stop_short):
        prompt = self.hasher.prompt_blocks(tokens, salt=salt)
        handles = []
        for cache in (self.tree, self.pool):
            match = cache.lookup(prompt, cap)
            stop = max(match.num_hit_blocks, prompt.num_full_blocks - stop_short)
            new = cache.insert(prompt, match.num_hit_blocks, stop_block=stop)
            handles.append(
                (
                    match.num_hit_blocks,
                    new.num_inserted_blocks,
                    new.num_existing_blocks,
                    new.num_refused_blocks,
                    match.handles + new.handles,
                )
            )
        (tree, pool) = handles
        assert tree[:4] == pool[:4]
        self.active.append((tree[4], pool[4]))

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def finish_request(self, data):
        tree_handles, pool_handles = self.active.pop(data.draw(st.integers(0, len(self.active) - 1)))
        self.tree.release(tree_handles)
        self.pool.release(pool_handles)

    @rule(seconds=st.sampled_from([0.0, 1.0, 4.0, 6.0]))
    def advance_time(self, seconds):
        self.now_s += seconds

    @invariant()
    def same_state(self):
        if hasattr(self, "tree"):
            self.pool.check_invariants()
            for name in ("num_cached_blocks", "num_evictable_blocks"):
                assert getattr(self.tree, name) == getattr(self.pool, name), name
            tree, pool = self.tree.stats, self.pool.stats
            assert (tree.num_hit_blocks, tree.num_evicted_blocks, tree.num_expired_blocks) == (
                pool.num_hit_blocks,
                pool.num_evicted_blocks,
                pool.num_expired_blocks,
            )


TestPoolRadixMatchesRadixCache = SideBySide.TestCase
TestPoolRadixMatchesRadixCache.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
