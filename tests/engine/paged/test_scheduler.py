"""The paged engine's scheduler (kvbench/engine/paged/scheduler.py): block tables over one BlockPool.

Pure Python: a fake "model" appends a token id derived from the sequence, so every rule (hits,
caching of prompt + output blocks, preemption, tail-first release, no leaked pin) is checked
without torch; the randomized test checks the invariants after every step.
"""

import random

import pytest

from kvbench.cache.block_hash import BlockHasher
from kvbench.engine.paged.scheduler import Scheduler, Sequence, SequenceStatus

BLOCK = 4


def make_scheduler(num_blocks=32, max_num_seqs=8, max_num_batched_tokens=64, caching=True, tail_first=True):
    return Scheduler(
        num_blocks,
        BLOCK,
        BlockHasher(BLOCK) if caching else None,
        max_num_seqs,
        max_num_batched_tokens,
        tail_first,
    )


def step(scheduler: Scheduler, max_output: dict[int, int]) -> list[Sequence]:
    """Schedule, 'compute', append one token to every sequence that samples; returns finished ones."""
    batch = scheduler.schedule()
    finished = []
    for seq, num_new in batch.items:
        scheduler.computed(seq, num_new)
        if seq.num_pending_tokens == 0:
            seq.token_ids.append(1000 + seq.num_tokens)  # deterministic "sample"
            if seq.num_tokens - seq.num_prompt_tokens >= max_output[seq.seq_id]:
                scheduler.finish(seq)
                finished.append(seq)
    return finished


def run_all(scheduler: Scheduler, seqs: list[Sequence], max_output: dict[int, int], check=True) -> int:
    for seq in seqs:
        scheduler.add(seq)
    steps = 0
    while scheduler.has_work:
        step(scheduler, max_output)
        steps += 1
        if check:
            scheduler.check_invariants(seqs)
        assert steps < 10_000
    return steps


def test_second_request_hits_the_first_prompt_and_output_blocks():
    scheduler = make_scheduler()
    first = Sequence(0, list(range(10)), 10)
    run_all(scheduler, [first], {0: 3})
    assert first.num_cached_tokens == 0
    # prompt 10 + output 3 - 1 = 12 computed tokens: 3 full blocks keyed
    assert first.num_inserted_blocks == 3 and scheduler.pool.num_cached_blocks == 3
    second = Sequence(1, list(first.token_ids) + [7, 7, 7], 16)  # carries the first one's output
    run_all(scheduler, [second], {1: 1})
    assert second.num_cached_tokens == 12  # the output block hits too
    assert scheduler.pool.num_used_blocks == 0


def test_hit_is_capped_at_the_last_prompt_token_and_salts_separate():
    scheduler = make_scheduler()
    run_all(scheduler, [Sequence(0, list(range(16)), 16)], {0: 1})
    again = Sequence(1, list(range(16)), 16)
    other_salt = Sequence(2, list(range(16)), 16, salt="tenant")
    run_all(scheduler, [again, other_salt], {1: 1, 2: 1})
    assert again.num_cached_tokens == 12  # (16 - 1) // 4 blocks: the last token is recomputed
    assert other_salt.num_cached_tokens == 0


def test_release_is_tail_first_so_the_tail_is_evicted_first():
    for tail_first, victim_order in ((True, "tail"), (False, "head")):
        scheduler = make_scheduler(tail_first=tail_first)
        seq = Sequence(0, list(range(13)), 13)
        run_all(scheduler, [seq], {0: 1})
        keyed = [scheduler.pool.block_key(b) for b in scheduler.pool.evictable_block_ids()]
        hashes = BlockHasher(BLOCK).block_hashes(list(range(12)))
        assert keyed == (hashes[::-1] if victim_order == "tail" else hashes)


def test_no_prefix_caching_keys_nothing():
    scheduler = make_scheduler(caching=False)
    seqs = [Sequence(i, list(range(20)), 20) for i in range(2)]
    run_all(scheduler, seqs, {0: 2, 1: 2})
    assert [s.num_cached_tokens for s in seqs] == [0, 0] and scheduler.pool.num_cached_blocks == 0


def test_token_budget_chunks_a_long_prefill_and_limits_sequences():
    scheduler = make_scheduler(max_num_batched_tokens=8, max_num_seqs=2)
    seqs = [Sequence(i, list(range(100 * i, 100 * i + 20)), 20) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    batch = scheduler.schedule()
    assert [(s.seq_id, n) for s, n in batch.items] == [(0, 8)]  # a chunk of the first prompt only
    for seq, n in batch.items:
        scheduler.computed(seq, n)
    assert len(scheduler.running) == 1
    run_all(scheduler, [], {0: 2, 1: 2, 2: 2})
    assert all(s.status is SequenceStatus.FINISHED for s in seqs)


def test_preemption_by_recompute_when_the_pool_runs_out():
    scheduler = make_scheduler(num_blocks=6)  # 24 tokens: two sequences of 9 + 8 outputs cannot both grow
    seqs = [Sequence(i, list(range(50 * i, 50 * i + 9)), 9) for i in range(2)]
    run_all(scheduler, seqs, {0: 8, 1: 8})
    assert scheduler.num_preemptions >= 1 and seqs[1].num_preemptions >= 1
    assert [len(s.token_ids) for s in seqs] == [17, 17]
    assert scheduler.pool.num_used_blocks == 0


@pytest.mark.parametrize("seed", range(6))
def test_randomized_no_leaked_pins(seed):
    """Random prompts sharing prefixes, a small pool (preemption), random aborts mid-run: the pool's
    ref counts equal the block tables after every step, and everything is free at the end."""
    rng = random.Random(seed)
    scheduler = make_scheduler(
        num_blocks=rng.choice([8, 12, 24]),
        max_num_seqs=rng.choice([1, 3, 8]),
        max_num_batched_tokens=rng.choice([4, 9, 64]),
        tail_first=rng.random() < 0.8,
    )
    prefixes = [[rng.randrange(500) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
    seqs, max_output = [], {}
    for i in range(25):
        prompt = rng.choice(prefixes) + [rng.randrange(500) for _ in range(rng.randrange(1, 8))]
        seqs.append(Sequence(i, prompt, len(prompt), salt=rng.choice(["", "", "s"])))
        max_output[i] = rng.randrange(1, 8)
    pending = list(seqs)
    while pending or scheduler.has_work:
        for _ in range(rng.randrange(0, 3)):
            if pending:
                scheduler.add(pending.pop(0))
        step(scheduler, max_output)
        if rng.random() < 0.1 and (scheduler.running or scheduler.waiting):
            scheduler.finish(rng.choice(scheduler.running or list(scheduler.waiting)))  # an abort
        scheduler.check_invariants(seqs)
    assert scheduler.pool.num_used_blocks == 0
    assert all(not s.block_table for s in seqs)
