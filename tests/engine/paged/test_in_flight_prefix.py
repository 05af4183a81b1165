"""Admission waits for a prefix another running sequence is computing (scheduler._next_block_in_flight).

Pure Python, as tests/engine/paged/test_scheduler.py: token ids and block ids only.
"""

from kvbench.cache.block_hash import BlockHasher
from kvbench.engine.paged.scheduler import Scheduler, Sequence

BLOCK = 4


def make_scheduler(max_num_batched_tokens=64, caching=True):
    return Scheduler(32, BLOCK, BlockHasher(BLOCK) if caching else None, 8, max_num_batched_tokens)


def compute(scheduler, batch):
    for seq, num_new in batch.items:
        scheduler.computed(seq, num_new)
        if seq.num_pending_tokens == 0:
            seq.token_ids.append(1000 + seq.num_tokens)


def test_a_shared_prefix_being_prefilled_is_waited_for_then_hit():
    scheduler = make_scheduler()
    system = list(range(12))  # 3 blocks shared by both
    first, second = Sequence(0, system + [50, 51], 14), Sequence(1, system + [60, 61, 62], 15)
    scheduler.add(first), scheduler.add(second)
    batch = scheduler.schedule()
    assert [seq.seq_id for seq, _ in batch.items] == [0]  # the second would compute the same 3 blocks
    compute(scheduler, batch)
    batch = scheduler.schedule()
    assert [(seq.seq_id, n) for seq, n in batch.items] == [(0, 1), (1, 3)]  # decode + the second's tail
    assert second.num_cached_tokens == 12
    scheduler.check_invariants([first, second])


def test_unrelated_prompts_and_prefix_caching_off_are_admitted_together():
    for caching, prompts in ((True, ([1] * 12, [2] * 12)), (False, ([1] * 12, [1] * 12))):
        scheduler = make_scheduler(caching=caching)
        for i, prompt in enumerate(prompts):
            scheduler.add(Sequence(i, list(prompt), len(prompt)))
        assert len(scheduler.schedule().items) == 2


def test_a_chunked_prefill_is_waited_for_until_its_blocks_are_keyed():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    shared = list(range(20))  # 5 blocks; the budget computes 2 per step
    first, second = Sequence(0, shared + [1], 21), Sequence(1, shared + [2], 21)
    scheduler.add(first), scheduler.add(second)
    admitted_at = None
    for step in range(6):
        batch = scheduler.schedule()
        if admitted_at is None and any(seq is second for seq, _ in batch.items):
            admitted_at = step
        compute(scheduler, batch)
    assert admitted_at == 3  # steps 0-2 compute the first's 21 tokens (8 + 8 + 5)
    assert second.num_cached_tokens == 20
