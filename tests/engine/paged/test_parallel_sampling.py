"""Parallel sampling (n > 1) and copy-on-write in the paged engine (scheduler.fork, KVPool.copy_blocks,
PagedEngine.submit_samples): one prefill, the prompt's blocks at ref count n, the partly filled last
block copied before a sample writes into it, every sample's blocks freed.

The scheduler tests are pure Python (a fake "model" appends a token id); the engine tests run a
scaled-down random Llama (as tests/engine/paged/test_paged_engine.py).
"""

import random
from concurrent.futures import CancelledError

import pytest
import torch
from readiness import LIMIT_S

from kvbench.cache.base import CacheConfig
from kvbench.cache.block_hash import BlockHasher
from kvbench.engine.paged.engine import PagedConfig, PagedEngine
from kvbench.engine.paged.scheduler import Scheduler, Sequence, SequenceStatus
from kvbench.engine.sampling import SamplingParams
from kvbench.memory.sharing import SharingConfig, simulate_parallel_sampling
from kvbench.request import Status

BLOCK = 4


def make_scheduler(num_blocks=64, max_num_batched_tokens=64):
    return Scheduler(num_blocks, BLOCK, BlockHasher(BLOCK), 16, max_num_batched_tokens)


def prefill_and_fork(scheduler, prompt_tokens, n):
    """Run the prompt's prefill as sample 0, then fork n - 1 samples; returns all n sequences."""
    prompt = list(range(100, 100 + prompt_tokens))
    parent = Sequence(0, list(prompt), prompt_tokens)
    scheduler.add(parent)
    (item,) = scheduler.schedule().items
    scheduler.computed(*item)
    children = [Sequence(i, list(prompt), prompt_tokens) for i in range(1, n)]
    scheduler.fork(parent, children)
    return [parent, *children]


def decode_step(scheduler, samples):
    """Every sample appends its own token (it differs per sample), then one step computes it."""
    for seq in samples:
        seq.token_ids.append(7000 + 10 * seq.seq_id + seq.num_tokens)
    batch = scheduler.schedule()
    for seq, num_new in batch.items:
        scheduler.computed(seq, num_new)
    return batch


@pytest.mark.parametrize("n", [2, 4])
def test_fork_shares_every_prompt_block_and_copies_the_partial_one_n_minus_1_times(n):
    scheduler = make_scheduler()
    samples = prefill_and_fork(scheduler, 10, n)  # blocks of 4: two full, one with 2 tokens
    table = list(samples[0].block_table)
    assert len(table) == 3 and all(seq.block_table == table for seq in samples)
    assert [scheduler.pool.ref_count(b) for b in table] == [n, n, n]
    scheduler.check_invariants(samples)
    batch = decode_step(scheduler, samples)
    assert [source for source, _ in batch.copies] == [table[2]] * (n - 1)
    assert [seq.num_copied_blocks for seq in samples] == [1] * (n - 1) + [0]  # the last writer keeps it
    assert samples[-1].block_table[2] == table[2] and scheduler.pool.ref_count(table[2]) == 1
    assert len({seq.block_table[2] for seq in samples}) == n  # every sample now writes its own block
    assert [scheduler.pool.ref_count(b) for b in table[:2]] == [n, n]  # the full blocks stay shared
    scheduler.check_invariants(samples)
    for _ in range(5):
        assert decode_step(scheduler, samples).copies == ()  # one copy per sample at most
    for seq in samples:
        scheduler.finish(seq)
    scheduler.check_invariants(samples)
    assert scheduler.pool.num_used_blocks == 0 and scheduler.num_copied_blocks == n - 1


def test_a_prompt_ending_on_a_block_boundary_copies_nothing():
    scheduler = make_scheduler()
    samples = prefill_and_fork(scheduler, 12, 3)
    assert all(scheduler.pool.ref_count(b) == 3 for b in samples[0].block_table)
    batch = decode_step(scheduler, samples)
    assert batch.copies == () and scheduler.num_copied_blocks == 0
    assert len({seq.block_table[3] for seq in samples}) == 3  # each sample's first token: its own new block
    scheduler.check_invariants(samples)


def test_fork_refuses_a_parent_that_has_not_finished_its_prefill():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    parent = Sequence(0, list(range(10)), 10)
    scheduler.add(parent)
    scheduler.computed(*scheduler.schedule().items[0])  # one chunk of 4 tokens out of 10
    with pytest.raises(ValueError, match="prompt computed"):
        scheduler.fork(parent, [Sequence(1, list(range(10)), 10)])
    with pytest.raises(ValueError, match="not a fresh sample"):
        scheduler.computed(*scheduler.schedule().items[0])
        scheduler.computed(*scheduler.schedule().items[0])
        scheduler.fork(parent, [Sequence(1, list(range(11)), 11)])


@pytest.mark.parametrize("seed", range(4))
def test_randomized_forks_with_preemption_leak_no_pin(seed):
    """Small pools force copy-on-write under preemption; ref counts are checked after every step."""
    rng = random.Random(seed)
    scheduler = Scheduler(rng.randint(12, 24), BLOCK, BlockHasher(BLOCK), 8, rng.randint(6, 20))
    live, max_output, pending = [], {}, []
    for _request in range(6):
        prompt = [rng.randrange(50) for _ in range(rng.randint(1, 13))]
        parent = Sequence(len(max_output), prompt, len(prompt))
        children = [
            Sequence(len(max_output) + i, list(prompt), len(prompt)) for i in range(1, rng.randint(1, 4))
        ]
        for seq in (parent, *children):
            max_output[seq.seq_id] = rng.randint(1, 9)
        scheduler.add(parent)
        pending.append((parent, children))
        live += [parent, *children]
    steps = 0
    while scheduler.has_work:
        batch = scheduler.schedule()
        for seq, num_new in batch.items:
            scheduler.computed(seq, num_new)
        for parent, children in list(pending):  # fork at the end of the prefill, as the engine does
            if (
                parent.status is SequenceStatus.RUNNING
                and not parent.num_pending_tokens
                and parent.num_tokens == parent.num_prompt_tokens
            ):
                scheduler.fork(parent, children)
                pending.remove((parent, children))
        for seq in list(scheduler.running):
            if seq.num_pending_tokens == 0:
                seq.token_ids.append(900 + seq.seq_id)
                if seq.num_tokens - seq.num_prompt_tokens >= max_output[seq.seq_id]:
                    scheduler.finish(seq)
        scheduler.check_invariants(live)
        steps += 1
        assert steps < 5000
    assert all(seq.status is SequenceStatus.FINISHED for seq in live)
    assert scheduler.pool.num_used_blocks == 0


# -- the engine ------------------------------------------------------------------------------------


def prompt_ids(n, seed=3):
    return random.Random(seed).choices(range(1000), k=n)


def paged(loaded, capacity=256, block_size=16, **config):
    return PagedEngine(loaded, PagedConfig(CacheConfig(capacity, block_size), **config))


def assert_clean(engine):
    engine.check_invariants()
    assert engine.scheduler.pool.num_used_blocks == 0


@pytest.mark.parametrize(("prompt_tokens", "copies"), [(40, 3), (48, 0)])
def test_greedy_samples_equal_the_n1_output_with_one_prefill(loaded, prompt_tokens, copies):
    engine, n = paged(loaded), 4
    prompt, sampling = prompt_ids(prompt_tokens), SamplingParams(max_tokens=12, ignore_eos=True)
    alone = paged(loaded).generate(prompt, sampling)
    ref_counts, prefill_tokens, tables = [], [], {}

    def on_token(sample, _token):
        running = engine.scheduler.running
        ref_counts.append(engine.scheduler.pool.ref_count(running[0].block_table[0]))
        if len(running) == n:
            tables[sample] = list(running[sample].block_table)

    original = engine._forward
    engine._forward = lambda group: (prefill_tokens.append(sum(n for _, n in group)), original(group))[1]
    records = [
        f.result(timeout=LIMIT_S) for f in engine.submit_samples(prompt, sampling, n, on_token=on_token)
    ]
    assert [r.output_token_ids for r in records] == [alone.output_token_ids] * n
    assert all(r.status is Status.OK and r.prompt_tokens == prompt_tokens for r in records)
    assert prefill_tokens[0] == prompt_tokens and prefill_tokens[1:] == [n] * (len(prefill_tokens) - 1)
    assert ref_counts[:n] == [n] * n  # while running, every sample holds the shared prompt block
    assert engine.scheduler.num_copied_blocks == copies
    last, slots = divmod(prompt_tokens, 16)
    blocks = [engine.kv_pool.block(tables[s][last])[..., :slots, :] for s in range(n)]  # the prompt's tail
    assert len({tables[s][last] for s in range(n)}) == n  # its own block per sample (copied or not)
    assert all(torch.equal(block, blocks[-1]) for block in blocks) and (
        slots == 0 or blocks[0].abs().sum() > 0
    )
    assert_clean(engine)


def test_copy_blocks_copies_every_layer_and_reads_sources_before_writing(loaded):
    pool = paged(loaded, capacity=8).kv_pool
    for layer in range(len(pool.keys)):
        pool.keys[layer].normal_()
        pool.values[layer].normal_()
    before = {b: pool.block(b) for b in range(1, 5)}
    pool.copy_blocks(((1, 2), (2, 3), (4, 1)))  # 2's old content goes to 3 although 2 is overwritten
    assert torch.equal(pool.block(2), before[1]) and torch.equal(pool.block(3), before[2])
    assert torch.equal(pool.block(1), before[4]) and torch.equal(pool.block(4), before[4])


def test_seeded_samples_differ_are_reproducible_and_sample_i_uses_seed_plus_i(loaded):
    prompt = prompt_ids(37, seed=5)
    sampling = SamplingParams(max_tokens=10, temperature=1.0, seed=7, ignore_eos=True)
    engine = paged(loaded, batch_invariant=True)  # one forward per sequence: exact against n = 1
    first = [f.result(timeout=LIMIT_S).output_token_ids for f in engine.submit_samples(prompt, sampling, 3)]
    again = [f.result(timeout=LIMIT_S).output_token_ids for f in engine.submit_samples(prompt, sampling, 3)]
    assert first == again and len(set(first)) == 3
    for index, tokens in enumerate(first):
        seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=7 + index, ignore_eos=True)
        assert paged(loaded).generate(prompt, seeded).output_token_ids == tokens
    assert_clean(engine)


def test_aborting_one_sample_frees_its_blocks_and_the_others_finish(loaded):
    engine = paged(loaded)
    futures = engine.submit_samples(prompt_ids(30), SamplingParams(max_tokens=60, ignore_eos=True), 3)
    engine.abort(futures[1])
    assert (
        futures[0].result(timeout=LIMIT_S).output_tokens
        == 60
        == futures[2].result(timeout=LIMIT_S).output_tokens
    )
    with pytest.raises(CancelledError):
        futures[1].result(timeout=LIMIT_S)
    assert futures[1].cancelled()
    assert_clean(engine)


def test_bad_n_and_bad_input(loaded):
    engine = paged(loaded, capacity=4)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        engine.submit_samples(prompt_ids(5), SamplingParams(), 0)
    records = [f.result() for f in engine.submit_samples(prompt_ids(90), SamplingParams(max_tokens=2), 2)]
    assert all(r.status is Status.ERROR and "the KV pool has 4" in r.error for r in records)


def test_measured_peak_equals_the_sharing_replay(loaded):
    """4 samples of a 40-token prompt (2 full blocks of 16 + 8 tokens), 20 tokens each: the pool's
    peak is what the block-manager replay (kvbench memory sharing) predicts."""
    engine = paged(loaded)
    records = [
        f.result(timeout=LIMIT_S)
        for f in engine.submit_samples(prompt_ids(40), SamplingParams(max_tokens=20, ignore_eos=True), 4)
    ]
    assert all(r.output_tokens == 20 for r in records)
    replay = simulate_parallel_sampling(SharingConfig(40, 20, 4, 16))
    memory, per_block = engine.memory_summary(), engine.kv_pool.bytes_per_block
    assert memory["peak_running_kv_bytes"] == replay.peak_used_blocks * per_block == 10 * per_block
    assert engine.scheduler.num_copied_blocks == replay.num_copies == 3
    assert memory["peak_unfilled_kv_bytes"] == 4 * 15 * per_block // 16  # each sample opens block 3
    assert memory["end_held_kv_bytes"] == memory["end_cached_kv_bytes"] > 0
    assert_clean(engine)
