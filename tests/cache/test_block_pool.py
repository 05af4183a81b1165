"""The one block pool (kvbench/cache/block_pool.py): its contract by hand, then random operations
against a plain-list model of the free queue, with ``check_invariants`` after every step."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvbench.cache.block_pool import BlockPool, OutOfBlocksError


def test_vllm_free_queue_order_empty_blocks_first_then_lru():
    pool = BlockPool(4, first_block_id=1)  # vLLM: block 0 is the null block
    blocks = pool.allocate(3)
    assert blocks == [1, 2, 3] and pool.num_free_blocks == 1
    pool.cache(1, b"k1")
    pool.cache(2, b"k2")
    assert pool.free(blocks[::-1]) == [3, 2, 1]  # 3 (empty) to the front; 2 then 1 to the end
    assert list(pool.evictable_block_ids()) == [2, 1]
    assert pool.allocate(3) == [3, 4, 2] and pool.num_evicted_blocks == 1  # empty, never used, LRU
    assert pool.cached_block(b"k2") is None and pool.cached_block(b"k1") == 1
    pool.check_invariants()


def test_fifo_variant_hands_out_never_used_ids_first_then_released_ones_in_release_order():
    pool = BlockPool(5, reuse_freed_first=False)  # nano-vllm's order, the memory block manager's
    pool.free(reversed(pool.allocate(3)))  # released last block first: 2, 1, 0
    assert pool.allocate(5) == [3, 4, 2, 1, 0]
    pool.check_invariants()


def test_lazy_eviction_a_freed_block_keeps_its_key_until_reused_and_touch_revives_it():
    pool = BlockPool(2)
    [a, b] = pool.allocate(2)
    pool.cache(a, "A")
    pool.cache(b, "B")
    pool.free([b, a])  # tail first: b is the next victim
    assert pool.num_evictable_blocks == 2 and pool.cached_block("A") == a
    pool.touch([a])  # a hit: off the free queue, used again
    assert pool.ref_count(a) == 1 and pool.num_free_blocks == 1 and list(pool.evictable_block_ids()) == [b]
    assert pool.allocate(1) == [b] and pool.cached_block("B") is None and pool.num_evicted_blocks == 1
    assert pool.cached_block("A") == a and pool.num_cached_blocks == 1
    pool.check_invariants()


def test_tail_first_release_evicts_a_chain_from_its_end():
    pool = BlockPool(3)
    chain = pool.allocate(3)
    for index, block_id in enumerate(chain):
        pool.cache(block_id, ("chain", index))
    pool.free(chain[::-1])
    pool.allocate(1)  # needs one block: the chain's tail goes
    assert [pool.cached_block(("chain", i)) for i in range(3)] == [chain[0], chain[1], None]


def test_uncache_moves_a_free_block_to_the_front_and_duplicates_are_allowed():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    pool.cache(blocks[0], "k")
    pool.cache(blocks[1], "k")  # vLLM may hold one key twice
    pool.cache(blocks[2], "z")
    assert pool.cached_block("k") == blocks[0]
    pool.free(blocks)
    pool.uncache(blocks[2])  # a TTL expiry
    assert pool.num_free_blocks == 3 and list(pool.evictable_block_ids()) == [blocks[0], blocks[1]]
    assert pool.allocate(2) == [blocks[2], blocks[0]] and pool.num_evicted_blocks == 1
    assert pool.cached_block("k") == blocks[1]
    pool.check_invariants()


def test_errors():
    pool = BlockPool(2)
    with pytest.raises(OutOfBlocksError):
        pool.allocate(3)
    assert pool.num_free_blocks == 2  # a refused allocation changes nothing
    [a, b] = pool.allocate(2)
    pool.free([a])
    with pytest.raises(ValueError, match="released more often"):
        pool.free([a])
    with pytest.raises(ValueError, match="holds no key"):
        pool.touch([a])
    with pytest.raises(ValueError, match="must be used"):
        pool.cache(a, "k")
    pool.cache(b, "k")
    with pytest.raises(ValueError, match="must be used"):
        pool.cache(b, "other")
    with pytest.raises(IndexError):
        pool.ref_count(2)
    for bad in (dict(num_blocks=0), dict(num_blocks=True), dict(num_blocks=2, first_block_id=-1)):
        with pytest.raises(ValueError):
            BlockPool(**bad)
    pool.check_invariants()


def test_invariant_check_catches_corruption():
    pool = BlockPool(3)
    pool.allocate(2)
    pool._ref_counts[0] = 0  # used by nobody, yet not on the free queue
    with pytest.raises(AssertionError, match="free queue"):
        pool.check_invariants()


class BlockPoolMachine(RuleBasedStateMachine):
    """Random allocate / cache / touch / free / uncache against a list model of the free queue."""

    NUM_BLOCKS = 8

    def __init__(self):
        super().__init__()
        self.reuse_freed_first = True
        self.pool = BlockPool(self.NUM_BLOCKS, first_block_id=1)
        self.queue = list(range(1, self.NUM_BLOCKS + 1))  # the model's free queue, front first
        self.refs = {}  # block id -> ref count, used blocks only
        self.keys = {}  # block id -> key
        self.num_evicted = 0
        self.handed_out = set()  # ids allocated at least once

    @rule(fifo=st.booleans())
    def restart(self, fifo):
        self.__init__()
        self.reuse_freed_first = not fifo
        self.pool = BlockPool(self.NUM_BLOCKS, first_block_id=1, reuse_freed_first=not fifo)

    def _empty_position(self):
        """Where the model puts an emptied block: the front (vLLM), or after the other empty and
        never-used ones (FIFO). Never-used ids count as empty here."""
        if self.reuse_freed_first:
            return 0
        return sum(1 for block_id in self.queue if block_id not in self.keys)

    @rule(num_blocks=st.integers(0, 4))
    def allocate(self, num_blocks):
        if num_blocks > len(self.queue):
            with pytest.raises(OutOfBlocksError):
                self.pool.allocate(num_blocks)
            return
        taken, self.queue = self.queue[:num_blocks], self.queue[num_blocks:]
        for block_id in taken:
            self.num_evicted += self.keys.pop(block_id, None) is not None
            self.refs[block_id] = 1
        self.handed_out.update(taken)
        assert self.pool.allocate(num_blocks) == taken

    @precondition(lambda self: self.refs)
    @rule(data=st.data(), key=st.integers(0, 5))
    def cache(self, data, key):
        block_id = data.draw(st.sampled_from(sorted(self.refs)))
        if block_id in self.keys:
            with pytest.raises(ValueError):
                self.pool.cache(block_id, key)
            return
        self.keys[block_id] = key
        self.pool.cache(block_id, key)

    @rule(key=st.integers(0, 5))
    def touch_a_hit(self, key):
        block_id = self.pool.cached_block(key)
        holders = [b for b, k in self.keys.items() if k == key]
        assert (block_id is None) == (not holders) and (block_id is None or block_id in holders)
        if block_id is None:
            return
        if block_id in self.queue:
            self.queue.remove(block_id)
        self.refs[block_id] = self.refs.get(block_id, 0) + 1
        self.pool.touch([block_id])

    @precondition(lambda self: self.refs)
    @rule(data=st.data())
    def free_tail_first(self, data):
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.refs)), min_size=1, max_size=4, unique=True))
        released, emptied = [], []
        for block_id in chosen:
            self.refs[block_id] -= 1
            if not self.refs[block_id]:
                del self.refs[block_id]
                released.append(block_id)
                (self.queue.append if block_id in self.keys else emptied.append)(block_id)
        position = self._empty_position()
        self.queue[position:position] = emptied
        assert self.pool.free(chosen) == released

    @precondition(lambda self: self.keys)
    @rule(data=st.data())
    def uncache(self, data):
        block_id = data.draw(st.sampled_from(sorted(self.keys)))
        del self.keys[block_id]
        if block_id in self.queue:
            self.queue.remove(block_id)  # to the front of the empty part
            position = 0 if self.reuse_freed_first else sum(b not in self.handed_out for b in self.queue)
            self.queue.insert(position, block_id)
        self.pool.uncache(block_id)

    @invariant()
    def agrees_with_the_model(self):
        self.pool.check_invariants()
        assert self.pool.num_free_blocks == len(self.queue)
        assert list(self.pool.evictable_block_ids()) == [b for b in self.queue if b in self.keys]
        assert {b: self.pool.ref_count(b) for b in self.pool.used_block_ids()} == self.refs
        assert {b: self.pool.block_key(b) for b in self.keys} == self.keys
        assert self.pool.num_cached_blocks == len(self.keys)
        assert self.pool.num_evicted_blocks == self.num_evicted
        assert self.pool.num_used_blocks == len(self.refs)

    def teardown(self):
        assert self.pool.allocate(len(self.queue)) == self.queue  # the whole free queue, front first


BlockPoolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestBlockPoolRandomized = BlockPoolMachine.TestCase
