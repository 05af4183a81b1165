"""Randomized lookup / insert / release / time-advance sequences keep both caches consistent."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvbench.cache.base import CacheConfig, make_cache
from kvbench.cache.block_hash import BlockHasher

BLOCK_SIZE = 2
# A small alphabet and short prompts: prompts share prefixes and diverge mid-run often.
token_lists = st.lists(st.integers(0, 2), min_size=0, max_size=12)


class CacheMachine(RuleBasedStateMachine):
    kind = "hash"

    def __init__(self):
        super().__init__()
        self.now_s = 0.0
        self.hasher = BlockHasher(BLOCK_SIZE)
        self.active = []  # (prompt, handles, blocks pinned from block 0)

    @initialize(
        capacity=st.integers(1, 12),
        ttl_s=st.sampled_from([None, 5.0]),
        release_order=st.sampled_from(["tail-first", "head-first"]),
    )
    def build(self, capacity, ttl_s, release_order):
        if self.kind == "radix":
            release_order = "tail-first"
        config = CacheConfig(
            capacity_blocks=capacity,
            block_size=BLOCK_SIZE,
            kind=self.kind,
            ttl_s=ttl_s,
            release_order=release_order,
        )
        self.cache = make_cache(config, clock=lambda: self.now_s)

    @rule(
        tokens=token_lists,
        cap=st.one_of(st.none(), st.integers(0, 6)),
        salt=st.sampled_from(["", "t"]),
        stop_short=st.integers(0, 2),
    )
    def start_request(self, tokens, cap, salt, stop_short):
        prompt = self.hasher.prompt_blocks(tokens, salt=salt)
        match = self.cache.lookup(prompt, cap)
        assert match.num_hit_blocks <= prompt.num_full_blocks
        stop = max(match.num_hit_blocks, prompt.num_full_blocks - stop_short)
        new = self.cache.insert(prompt, match.num_hit_blocks, stop_block=stop)
        stored = new.num_inserted_blocks + new.num_existing_blocks
        assert stored + new.num_refused_blocks == stop - match.num_hit_blocks
        self.active.append((prompt, match.handles + new.handles, match.num_hit_blocks + stored))

    @precondition(lambda self: self.active)
    @rule(data=st.data())
    def finish_request(self, data):
        index = data.draw(st.integers(0, len(self.active) - 1))
        _, handles, _ = self.active.pop(index)
        self.cache.release(handles)

    @rule(seconds=st.sampled_from([0.0, 1.0, 4.0, 6.0]))
    def advance_time(self, seconds):
        self.now_s += seconds

    @rule()
    def sweep(self):
        self.cache.sweep()

    @invariant()
    def consistent(self):
        if not hasattr(self, "cache"):
            return
        self.cache.check_invariants()
        cache = self.cache
        assert 0 <= cache.num_evictable_blocks <= cache.num_cached_blocks <= cache.config.capacity_blocks

    @invariant()
    def pinned_blocks_are_never_evicted(self):
        if not hasattr(self, "cache"):
            return
        for prompt, _, num_pinned in self.active:
            match = self.cache.lookup(prompt)
            assert match.num_hit_blocks >= num_pinned, "a pinned block was evicted"
            self.cache.release(match.handles)

    def teardown(self):
        if hasattr(self, "cache"):
            for _, handles, _ in self.active:
                self.cache.release(handles)
            self.cache.check_invariants()
            assert self.cache.num_evictable_blocks == self.cache.num_cached_blocks  # nothing leaked


class RadixMachine(CacheMachine):
    kind = "radix"


TestHashCacheRandom = CacheMachine.TestCase
TestRadixCacheRandom = RadixMachine.TestCase
TestHashCacheRandom.settings = TestRadixCacheRandom.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
