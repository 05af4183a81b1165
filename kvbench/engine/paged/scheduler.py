"""Block tables, the prefix cache over one block pool, and the continuous-batching scheduler (pure Python).

One :class:`~kvbench.cache.block_pool.BlockPool` owns every block, as vLLM v1's does: a running
sequence's blocks are ref-counted pool blocks; a full block gets its chained hash as its key
(``BlockPool.cache``) and stays findable after release until an allocation evicts it (lazy
eviction, LRU, a chain's tail first). The rules are those of :mod:`kvbench.sim.vllm_pool` (sources
there), which is why that simulator predicts this engine's ``cached_tokens`` at concurrency 1:

* **lookup** at admission: the longest prefix of the sequence's block hashes held by the pool, capped
  at ``(tokens - 1) // block_size`` blocks; hit blocks are touched (pinned, off the free queue);
  ``num_cached_tokens`` is fixed at the first admission (vLLM's ``Request.num_cached_tokens``);
* **caching**: after every forward, every newly full block of prompt + output gets its key, so
  ``(prompt + output - 1) // block_size`` blocks end up cached (the last sampled token's KV is never
  computed);
* **release**: a finished, aborted or preempted sequence frees its blocks tail first (``reversed``
  block table; vLLM ``SingleTypeKVCacheManager.free``), or head first to demonstrate the bug.

Scheduling, one step (vLLM v1 ``Scheduler.schedule``, simplified): running sequences first, in
admission order, each with its remaining tokens (1 when decoding; a prefill chunk when the token
budget ``max_num_batched_tokens`` runs short); a running sequence that cannot get a block preempts
the most recently admitted one (its blocks are freed and it rejoins the front of the waiting queue
to be recomputed, vLLM v1's preemption mode). Then, if nothing was preempted, waiting sequences are
admitted FCFS while the budget, ``max_num_seqs`` and the free blocks allow, and while the head of the
queue does not miss a block a running sequence is about to compute (it waits to hit it instead:
``Scheduler._next_block_in_flight``).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvbench.cache.block_hash import BlockHash, BlockHasher
from kvbench.cache.block_pool import BlockPool
from kvbench.engine.paged.kv_pool import NULL_BLOCK_ID


class SequenceStatus(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine.

    Attributes:
        seq_id: unique per engine.
        token_ids: prompt + output so far.
        num_prompt_tokens: the prompt's length.
        salt: its cache namespace.
        block_table: logical block i -> pool block id.
        num_computed_tokens: tokens whose K/V is in the pool (a prefix of ``token_ids``).
        num_cached_tokens: prompt tokens the first admission found cached; ``None`` until admitted.
        num_inserted_blocks: blocks this sequence gave a new key.
        num_preemptions: times it was preempted and recomputed.
    """

    seq_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    salt: str = ""
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None
    num_inserted_blocks: int = 0
    num_preemptions: int = 0
    _num_keyed_blocks: int = 0  # leading blocks of the table known to hold their key
    _block_hashes: list[BlockHash] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to compute before the next sample (the whole rest of a prefill, or 1)."""
        return self.num_tokens - self.num_computed_tokens


@dataclass(frozen=True)
class ScheduledBatch:
    """One step's work: ``(sequence, tokens to compute)`` pairs in admission order, and who was
    preempted to make room."""

    items: tuple[tuple[Sequence, int], ...]
    preempted: tuple[Sequence, ...] = ()


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class Scheduler:
    """FCFS continuous batching over one :class:`BlockPool` (module docstring).

    ``hasher`` ``None`` turns prefix caching off (nothing is looked up or keyed). Block ids start at
    1: block 0 is the pool's null block.
    """

    def __init__(self, num_blocks: int, block_size: int, hasher: BlockHasher | None, max_num_seqs: int,
                 max_num_batched_tokens: int, tail_first: bool = True) -> None:
        self.pool = BlockPool(num_blocks, first_block_id=NULL_BLOCK_ID + 1)
        self.block_size = block_size
        self.hasher = hasher
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self._tail_first = tail_first
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # -- queue -------------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """Pick this step's sequences and allocate their blocks (module docstring)."""
        budget, items, preempted = self.max_num_batched_tokens, [], []
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_pending_tokens, budget)
            if not self._grow_or_preempt(seq, num_new, preempted):
                break  # seq preempted itself: it was the last one running
            items.append((seq, num_new))
            budget -= num_new
            index += 1
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            admitted = self._admit(self.waiting[0], budget)
            if admitted is None:
                break
            self.waiting.popleft()
            items.append(admitted)
            budget -= admitted[1]
        return ScheduledBatch(tuple(items), tuple(preempted))

    def _grow_or_preempt(self, seq: Sequence, num_new: int, preempted: list[Sequence]) -> bool:
        """Give ``seq`` blocks for ``num_new`` more tokens, preempting from the back; ``False`` if
        ``seq`` itself had to go."""
        need = blocks_for(seq.num_computed_tokens + num_new, self.block_size) - len(seq.block_table)
        while not self.pool.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        seq.block_table.extend(self.pool.allocate(need))
        return True

    def _admit(self, seq: Sequence, budget: int) -> tuple[Sequence, int] | None:
        """Look up, pin the hit, allocate the first chunk; ``None`` (changing nothing) if it does not fit."""
        hit = self._lookup(seq)
        if self._next_block_in_flight(seq, len(hit)):
            return None
        num_hit_tokens = len(hit) * self.block_size
        num_new = min(seq.num_tokens - num_hit_tokens, budget)
        need = blocks_for(num_hit_tokens + num_new, self.block_size) - len(hit)
        num_evictable_hits = sum(self.pool.ref_count(b) == 0 for b in hit)
        if need + num_evictable_hits > self.pool.num_free_blocks:
            return None
        self.pool.touch(hit)
        seq.block_table = hit + self.pool.allocate(need)
        seq.num_computed_tokens = num_hit_tokens
        seq._num_keyed_blocks = len(hit)
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = num_hit_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return seq, num_new

    def _next_block_in_flight(self, seq: Sequence, num_hit_blocks: int) -> bool:
        """Whether the first block ``seq`` misses is one a running sequence has yet to compute: then
        ``seq`` waits (FCFS: so does everyone behind it) and hits that block once it is keyed, instead
        of computing it a second time in parallel. Concurrent first turns sharing a system prompt
        otherwise each prefill all of it (vLLM v1 does; SGLang's in-batch prefix caching,
        ``schedule_policy.py`` ``IN_BATCH_PREFIX_CACHING_*``, defers such requests the same way).
        Never at concurrency 1 (nothing runs at admission), so the vLLM-faithful prediction holds."""
        if self.hasher is None or not self.running or num_hit_blocks >= (seq.num_tokens - 1) // self.block_size:
            return False
        wanted = self._keys(seq)[num_hit_blocks]
        return any(wanted in self._keys(other)[other._num_keyed_blocks:] for other in self.running)

    def _lookup(self, seq: Sequence) -> list[int]:
        if self.hasher is None:
            return []
        hit: list[int] = []
        for key in self._keys(seq)[: (seq.num_tokens - 1) // self.block_size]:
            block_id = self.pool.cached_block(key)
            if block_id is None:
                break
            hit.append(block_id)
        return hit

    def _keys(self, seq: Sequence) -> list[BlockHash]:
        """Keys of every full block of ``seq.token_ids`` (recomputed only when a block has filled)."""
        num_full = seq.num_tokens // self.block_size
        if len(seq._block_hashes) < num_full:
            seq._block_hashes = self.hasher.block_hashes(seq.token_ids[: num_full * self.block_size], salt=seq.salt)
        return seq._block_hashes

    # -- after a forward ---------------------------------------------------------------------------

    def computed(self, seq: Sequence, num_new: int) -> None:
        """``num_new`` more tokens of ``seq`` now have K/V in the pool: key its newly full blocks."""
        seq.num_computed_tokens += num_new
        if self.hasher is None:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq._num_keyed_blocks:
            return
        keys = self._keys(seq)
        for index in range(seq._num_keyed_blocks, num_full):
            block_id = seq.block_table[index]
            if self.pool.block_key(block_id) is None:
                self.pool.cache(block_id, keys[index])
                seq.num_inserted_blocks += 1
        seq._num_keyed_blocks = num_full

    def finish(self, seq: Sequence) -> None:
        """Release a finished or aborted sequence, wherever it is (idempotent)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._free(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _free(self, seq: Sequence) -> None:
        table = seq.block_table
        self.pool.free(reversed(table) if self._tail_first else table)
        seq.block_table = []
        seq._num_keyed_blocks = 0

    # -- checking ----------------------------------------------------------------------------------

    def check_invariants(self, live: Iterable[Sequence] = ()) -> None:
        """Raise ``AssertionError`` unless the pool agrees with the block tables: every block's ref
        count is the number of running tables holding it (no leaked or missing pin), waiting and
        finished sequences hold nothing, and the pool's own invariants hold."""
        self.pool.check_invariants()
        expected: dict[int, int] = {}
        for seq in self.running:
            if seq.status is not SequenceStatus.RUNNING:
                raise AssertionError(f"sequence {seq.seq_id} is in the running list as {seq.status.value}")
            if len(seq.block_table) < blocks_for(seq.num_computed_tokens, self.block_size):
                raise AssertionError(f"sequence {seq.seq_id} computed more tokens than its blocks hold")
            for block_id in seq.block_table:
                expected[block_id] = expected.get(block_id, 0) + 1
        for seq in (*self.waiting, *live):
            if seq.status is not SequenceStatus.RUNNING and seq.block_table:
                raise AssertionError(f"{seq.status.value} sequence {seq.seq_id} still holds blocks")
        actual = {b: self.pool.ref_count(b) for b in self.pool.used_block_ids()}
        if actual != expected:
            raise AssertionError(f"pool ref counts {actual} disagree with the block tables {expected}")
