"""The scheduler's radix kind (kvbench/cache/block_index.py) and the --max-num-seqs cap on forked
samples: pure Python, the fake "model" of test_scheduler.py."""

import random

import pytest
from test_scheduler import BLOCK, run_all, step

from kvbench.cache.block_hash import BlockHasher
from kvbench.engine.paged.scheduler import Scheduler, Sequence, SequenceStatus


def make_scheduler(kind, num_blocks=32, max_num_seqs=8, max_num_batched_tokens=64, tail_first=True):
    return Scheduler(
        num_blocks, BLOCK, BlockHasher(BLOCK), max_num_seqs, max_num_batched_tokens, tail_first, kind=kind
    )


def test_radix_keys_are_parent_block_and_token_bytes_and_salts_have_their_own_root():
    scheduler = make_scheduler("radix")
    first = Sequence(0, list(range(9)), 9)
    run_all(scheduler, [first], {0: 1})
    pool = scheduler.pool
    keys = [pool.block_key(b) for b in reversed(list(pool.evictable_block_ids()))]  # block 0 first
    assert keys[0] == (("root", ""), bytes(bytearray(b"".join(i.to_bytes(4, "little") for i in range(4)))))
    assert keys[1][0] == pool.cached_block(keys[0])  # block 1 hangs under block 0's pool block
    salted = Sequence(1, list(range(9)), 9, salt="tenant")
    again = Sequence(2, list(range(9)), 9)
    run_all(scheduler, [salted, again], {1: 1, 2: 1})
    assert salted.num_cached_tokens == 0 and again.num_cached_tokens == 8


@pytest.mark.parametrize("kind, cached_blocks", [("hash", 5), ("radix", 4)])
def test_a_block_computed_twice_is_deduplicated_by_radix_only(kind, cached_blocks):
    """A 16-token prompt sent twice: the cap makes the second recompute block 3. vLLM's hash pool keys
    the copy too (two holders of one key); radix switches the table to the tree's block and frees the
    copy (SGLang cache_unfinished_req)."""
    scheduler = make_scheduler(kind)
    seqs = [Sequence(i, list(range(16)), 16) for i in range(2)]
    run_all(scheduler, seqs[:1], {0: 1})
    run_all(scheduler, seqs[1:], {1: 1})
    assert seqs[1].num_cached_tokens == 12
    assert scheduler.pool.num_cached_blocks == cached_blocks
    assert scheduler.index.num_deduplicated_blocks == (1 if kind == "radix" else 0)


@pytest.mark.parametrize("kind, hit_tokens", [("hash", 4), ("radix", 8)])
def test_radix_and_hash_cache_differently_at_concurrency_1(kind, hit_tokens):
    """The same pool of 4 blocks: a 12-token prompt, a 4-token prompt three times (capped at 0 hit
    blocks, so computed again each time), then the first prompt extended. Hash keeps each copy of the
    short prompt's block and evicts two of the long prompt's blocks for them; radix frees each copy."""
    scheduler = make_scheduler(kind, num_blocks=4, max_num_seqs=1)
    long, short = list(range(12)), [100, 101, 102, 103]
    prompts = [long, short, short, short, long + [12, 13, 14, 15]]
    seqs = [Sequence(i, list(p), len(p)) for i, p in enumerate(prompts)]
    for seq in seqs:
        run_all(scheduler, [seq], {seq.seq_id: 1})
    assert seqs[-1].num_cached_tokens == hit_tokens


def step_with_forks(scheduler, max_output, forks):
    """:func:`step`, but a sequence in ``forks`` (seq id -> fresh samples) forks them once its prompt is
    computed, before anyone samples (as PagedEngine._sample does); returns the samples started."""
    started = []
    for seq, num_new in scheduler.schedule().items:
        scheduler.computed(seq, num_new)
        if seq.num_pending_tokens:
            continue
        samples = [seq]
        if seq.seq_id in forks:
            samples += scheduler.fork(seq, forks.pop(seq.seq_id))
            started += samples[1:]
        for sample in samples:
            sample.token_ids.append(1000 + sample.num_tokens)
            if sample.num_tokens - sample.num_prompt_tokens >= max_output[sample.seq_id]:
                scheduler.finish(sample)
    return started


def test_forked_samples_count_against_max_num_seqs():
    """vLLM v1 makes each of n samples its own request: with --max-num-seqs 2, a prompt's n = 4 runs
    2 samples; the other 2 wait, are admitted as the first finish, and hit the prompt's blocks."""
    scheduler = make_scheduler("hash", max_num_seqs=2)
    parent, *children = [Sequence(i, list(range(10)), 10) for i in range(4)]
    scheduler.add(parent)
    max_output = {i: 3 for i in range(4)}
    assert step_with_forks(scheduler, max_output, {0: children}) == children[:1]
    assert len(scheduler.running) == 2 and list(scheduler.waiting) == children[1:]
    peak = 0
    while scheduler.has_work:
        step(scheduler, max_output)
        peak = max(peak, len(scheduler.running))
        scheduler.check_invariants([parent, *children])
    assert peak == 2
    assert all(s.status is SequenceStatus.FINISHED and s.num_tokens == 13 for s in [parent, *children])
    assert [s.num_cached_tokens for s in children[1:]] == [8, 8]  # (10 - 1) // 4 blocks of the prompt hit


def random_run(seed):
    """Random prompts sharing prefixes, a small pool (preemption, eviction), parallel samples past the
    sequence cap, random aborts: the index's invariants (a pinned block's parent pinned, a free
    parent behind its children, one block per key) and the ref counts hold after every step."""
    rng = random.Random(seed)
    scheduler = make_scheduler(
        "radix",
        num_blocks=rng.choice([10, 14, 24]),
        max_num_seqs=rng.choice([2, 3, 8]),
        max_num_batched_tokens=rng.choice([4, 9, 64]),
    )
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
    seqs, max_output, forks = [], {}, {}
    for i in range(25):
        prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 8))]
        seqs.append(Sequence(i, prompt, len(prompt), salt=rng.choice(["", "", "s"])))
        max_output[i] = rng.randrange(1, 6)
        if rng.random() < 0.3:
            forks[i] = [
                Sequence(1000 + 10 * i + k, list(prompt), len(prompt), seqs[i].salt)
                for k in range(rng.randrange(1, 4))
            ]
            seqs += forks[i]
            max_output.update({child.seq_id: max_output[i] for child in forks[i]})
    pending, num_started = [s for s in seqs if s.seq_id < 1000], 0
    while pending or scheduler.has_work:
        for _ in range(rng.randrange(0, 3)):
            if pending:
                scheduler.add(pending.pop(0))
        num_started += len(step_with_forks(scheduler, max_output, forks))
        if rng.random() < 0.1 and (scheduler.running or scheduler.waiting):
            scheduler.finish(rng.choice(scheduler.running or list(scheduler.waiting)))  # an abort
        scheduler.check_invariants(seqs)
    assert scheduler.pool.num_used_blocks == 0 and all(not s.block_table for s in seqs)
    return (
        num_started,
        scheduler.pool.num_evicted_blocks,
        scheduler.index.num_deduplicated_blocks,
        scheduler.num_preemptions,
    )


SEEDS = range(8)


@pytest.mark.parametrize("seed", SEEDS)
def test_randomized_radix_pool_invariants_with_forks_and_aborts(seed):
    random_run(seed)


def test_the_randomized_runs_fork_evict_deduplicate_and_preempt():
    """Not vacuous: over the seeds, samples start, blocks are evicted and deduplicated, sequences
    preempted."""
    totals = [sum(column) for column in zip(*(random_run(seed) for seed in SEEDS))]
    assert all(total > 0 for total in totals), totals


def test_radix_refuses_head_first_release():
    with pytest.raises(ValueError, match="head-first release exists only for the hash cache"):
        make_scheduler("radix", tail_first=False)
