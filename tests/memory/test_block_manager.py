"""The paged block manager: tables, ref counts, fork, copy-on-write; and the sharing runs on it."""

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvbench.memory.block_manager import (
    BlockCopy,
    BlockManager,
    BlockManagerConfig,
    OutOfBlocksError,
)
from kvbench.memory.sharing import SharingConfig, simulate_beam_search, simulate_parallel_sampling


def manager(num_blocks=1000, block_size=16):
    return BlockManager(BlockManagerConfig(num_blocks, block_size))


# -- parallel sampling of a prompt that ends mid-block ----------------------------------------------


def test_four_samples_of_a_2008_token_prompt_share_then_copy_the_partial_block():
    blocks = manager()
    samples = ["s0", "s1", "s2", "s3"]
    table = blocks.allocate("s0", 2008)
    for sample in samples[1:]:
        blocks.fork("s0", sample)
    full, partial = table[:125], table[125]
    assert len(table) == 126 and 2008 - 125 * 16 == 8  # 125 full blocks + one with 8 tokens
    assert all(blocks.ref_count(block) == 4 for block in table)
    assert blocks.num_shared_blocks == 126 and blocks.num_used_blocks == 126
    blocks.check_invariants()

    results = [blocks.append(sample) for sample in samples]  # every sample writes its first token
    copies = [copy for result in results for copy in result.copies]
    assert len(copies) == 3 and blocks.num_copies == 3
    assert all(copy.source_block_id == partial for copy in copies)
    assert blocks.block_table("s3")[-1] == partial  # the last writer owns the original
    assert blocks.ref_count(partial) == 1
    assert len({blocks.block_table(sample)[-1] for sample in samples}) == 4
    blocks.check_invariants()

    for _ in range(255):  # the rest of 256 tokens each
        for sample in samples:
            assert blocks.append(sample).copies == ()
        assert all(blocks.ref_count(block) == 4 for block in full)  # full prompt blocks stay shared
    blocks.check_invariants()
    assert blocks.num_copies == 3

    for sample in samples:
        blocks.free(sample)
    assert blocks.num_free_blocks == 1000 and blocks.num_used_blocks == 0
    blocks.check_invariants()


def test_parallel_sampling_run_reports_the_same_numbers():
    result = simulate_parallel_sampling(SharingConfig(prompt_tokens=2008, max_tokens=256, num_sequences=4))
    assert result.num_prompt_blocks == 126
    assert result.num_shared_prompt_blocks == 126
    assert result.num_copies_after_first_token == 3 and result.num_copies == 3
    assert result.num_shared_blocks_after_first_token == 125
    # shared: 125 prompt blocks + per sample (8 + 256 = 264 tokens from block 125 on) 17 blocks
    assert result.peak_used_blocks == 125 + 4 * 17
    assert result.peak_unshared_blocks == 4 * math.ceil((2008 + 256) / 16)
    assert result.num_used_blocks_after_free == 0


def test_prompt_on_a_block_boundary_needs_no_copy():
    result = simulate_parallel_sampling(SharingConfig(prompt_tokens=2000, max_tokens=40, num_sequences=3))
    assert result.num_copies == 0
    assert result.num_shared_blocks_after_first_token == 125


# -- beam search --------------------------------------------------------------------------------------


def test_beam_search_shares_and_frees_everything():
    config = SharingConfig(prompt_tokens=2008, max_tokens=256, num_sequences=4, seed=1)
    result = simulate_beam_search(config)
    assert result.num_used_blocks_after_free == 0
    assert result.num_forks == result.num_freed_sequences + 3  # 1 beam -> 4, then width stays 4
    assert result.num_forks >= 3 and result.num_copies >= 3
    assert result.peak_used_blocks < result.peak_unshared_blocks == 4 * math.ceil(2264 / 16)
    assert all(
        used <= unshared
        for used, unshared in zip(result.used_blocks_per_step, result.unshared_blocks_per_step)
    )
    assert simulate_beam_search(config) == result  # seeded: the same run again


def test_beam_width_one_never_forks():
    result = simulate_beam_search(SharingConfig(prompt_tokens=30, max_tokens=50, num_sequences=1))
    assert (result.num_forks, result.num_copies, result.num_freed_sequences) == (0, 0, 0)
    assert result.peak_used_blocks == result.peak_unshared_blocks == math.ceil(80 / 16)


# -- single operations --------------------------------------------------------------------------------


def test_append_copies_then_takes_new_blocks_across_boundaries():
    blocks = manager(num_blocks=20, block_size=4)
    blocks.allocate("a", 6)  # 2 blocks, the second half full
    blocks.fork("a", "b")
    assert blocks.num_blocks_to_append("a", 7) == 1 + 2  # a copy + blocks for tokens 9..13
    result = blocks.append("a", 7)
    assert len(result.copies) == 1 and len(result.new_block_ids) == 2
    assert result.copies[0] == BlockCopy(blocks.block_table("b")[1], blocks.block_table("a")[1])
    assert blocks.num_tokens("a") == 13 and len(blocks.block_table("a")) == 4
    assert blocks.block_table("a")[0] == blocks.block_table("b")[0]
    blocks.check_invariants()


def test_a_failed_append_changes_nothing():
    blocks = manager(num_blocks=3, block_size=4)
    blocks.allocate("a", 6)
    blocks.fork("a", "b")
    assert not blocks.can_append("a", 7)
    before = (blocks.block_table("a"), blocks.num_free_blocks, blocks.num_copies)
    with pytest.raises(OutOfBlocksError):
        blocks.append("a", 7)
    assert (blocks.block_table("a"), blocks.num_free_blocks, blocks.num_copies) == before
    with pytest.raises(OutOfBlocksError):
        blocks.allocate("c", 8)
    assert "c" not in blocks.seq_ids
    blocks.check_invariants()


def test_bad_ids_and_counts():
    blocks = manager(num_blocks=4, block_size=4)
    blocks.allocate("a", 3)
    with pytest.raises(ValueError, match="already"):
        blocks.allocate("a", 1)
    with pytest.raises(ValueError, match="already"):
        blocks.fork("a", "a")
    with pytest.raises(KeyError, match="unknown sequence 'z'"):
        blocks.fork("z", "y")
    with pytest.raises(KeyError):
        blocks.free("z")
    with pytest.raises(ValueError, match="num_tokens"):
        blocks.append("a", 0)
    with pytest.raises(ValueError):
        BlockManagerConfig(num_blocks=0)


def test_free_returns_blocks_tail_first_and_only_unshared_ones():
    blocks = manager(num_blocks=8, block_size=2)
    table = blocks.allocate("a", 5)  # two full blocks and one with a single token
    blocks.fork("a", "b")
    blocks.append("b", 1)  # b copies the shared partial block
    assert blocks.free("a") == (table[2],)  # b still points at the two full ones
    b_table = blocks.block_table("b")
    assert b_table[:2] == table[:2]
    assert blocks.free("b") == tuple(reversed(b_table))  # last block first
    assert blocks.num_used_blocks == 0
    blocks.check_invariants()


def test_a_huge_pool_costs_only_the_blocks_touched():
    blocks = manager(num_blocks=10**12, block_size=16)  # 1 PB of the default model's blocks
    assert blocks.allocate("a", 40) == (0, 1, 2)
    assert blocks.num_free_blocks == 10**12 - 3 and blocks.ref_count(10**12 - 1) == 0
    blocks.free("a")
    assert blocks.allocate("b", 64) == (3, 4, 5, 6)
    blocks.check_invariants()
    with pytest.raises(IndexError):
        blocks.ref_count(10**12)


def test_never_used_blocks_go_first_then_released_ones_in_release_order():
    blocks = manager(num_blocks=5, block_size=16)
    blocks.allocate("a", 40)
    blocks.free("a")  # released last block first: 2, 1, 0
    assert blocks.allocate("b", 64) == (3, 4, 2, 1)


def test_invariant_check_catches_corruption():
    blocks = manager(num_blocks=4, block_size=4)
    blocks.allocate("a", 5)
    blocks.pool._ref_counts[blocks.block_table("a")[0]] += 1
    with pytest.raises(AssertionError, match="ref count"):
        blocks.check_invariants()


# -- randomized -----------------------------------------------------------------------------------------


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / fork / append / free; invariants after every step.

    Beside the manager it keeps what an engine would: the KV slots of every physical block (written
    through the block tables, with copy-on-write copies applied) and each sequence's expected
    tokens, so a sequence that writes into a block another one still reads is caught.
    """

    BLOCK_SIZE = 4

    def __init__(self):
        super().__init__()
        self.blocks = BlockManager(BlockManagerConfig(num_blocks=24, block_size=self.BLOCK_SIZE))
        self.tokens = {}  # seq -> the tokens it wrote, in order
        self.slots = {}  # physical block -> its slots
        self.next_id = 0

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    def _write(self, seq, new_tokens):
        table = self.blocks.block_table(seq)
        start = len(self.tokens[seq])
        for offset, token in enumerate(new_tokens):
            block, slot = divmod(start + offset, self.BLOCK_SIZE)
            self.slots.setdefault(table[block], [None] * self.BLOCK_SIZE)[slot] = token
        self.tokens[seq] += new_tokens

    @rule(num_tokens=st.integers(0, 30))
    def allocate(self, num_tokens):
        seq = self._new_id()
        if self.blocks.can_allocate(num_tokens):
            self.blocks.allocate(seq, num_tokens)
            self.tokens[seq] = []
            self._write(seq, [(seq, i) for i in range(num_tokens)])
        else:
            with pytest.raises(OutOfBlocksError):
                self.blocks.allocate(seq, num_tokens)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = self._new_id()
        self.blocks.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), num_tokens=st.integers(1, 9))
    def append(self, data, num_tokens):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        used_before = self.blocks.num_used_blocks
        if self.blocks.can_append(seq, num_tokens):
            needed = self.blocks.num_blocks_to_append(seq, num_tokens)
            result = self.blocks.append(seq, num_tokens)
            for copy in result.copies:
                self.slots[copy.target_block_id] = list(self.slots[copy.source_block_id])
            start = len(self.tokens[seq])
            self._write(seq, [(seq, start + i) for i in range(num_tokens)])
            assert self.blocks.num_used_blocks == used_before + needed
        else:
            with pytest.raises(OutOfBlocksError):
                self.blocks.append(seq, num_tokens)
            assert self.blocks.num_used_blocks == used_before

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        released = self.blocks.free(seq)
        del self.tokens[seq]
        assert all(self.blocks.ref_count(block) == 0 for block in released)

    @invariant()
    def consistent(self):
        self.blocks.check_invariants()
        assert {seq: self.blocks.num_tokens(seq) for seq in self.blocks.seq_ids} == {
            seq: len(tokens) for seq, tokens in self.tokens.items()
        }
        for seq, tokens in self.tokens.items():  # what each sequence reads through its table
            table = self.blocks.block_table(seq)
            read = [self.slots[table[i // self.BLOCK_SIZE]][i % self.BLOCK_SIZE] for i in range(len(tokens))]
            assert read == tokens, f"sequence {seq} reads another sequence's KV"

    def teardown(self):
        for seq in list(self.tokens):
            self.blocks.free(seq)
        self.blocks.check_invariants()
        assert self.blocks.num_free_blocks == 24


BlockManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestBlockManagerRandomized = BlockManagerMachine.TestCase
