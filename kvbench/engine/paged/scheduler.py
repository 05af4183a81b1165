"""Block tables, the prefix cache over one block pool, and the continuous-batching scheduler (pure Python).

One :class:`~kvbench.cache.block_pool.BlockPool` owns every block, as vLLM v1's does: a running
sequence's blocks are ref-counted pool blocks; a full block gets its key (``BlockPool.cache``) and
stays findable after release until an allocation evicts it (lazy eviction, LRU, a chain's tail
first). The key is the cache kind's (:class:`~kvbench.cache.block_index.PoolIndex`): the chained
block hash (``hash``, vLLM) or ``(parent block, token bytes)``, a radix tree over the pool's blocks
(``radix``, SGLang: duplicates deduplicated when keyed, eviction = LRU unpinned leaf); everything
else below is one scheduler for both. The rules are those of :mod:`kvbench.sim.vllm_pool` (sources
there), which is why that simulator predicts this engine's ``cached_tokens`` at concurrency 1:

* **lookup** at admission: the longest prefix of the sequence's block hashes held by the pool, capped
  at ``(tokens - 1) // block_size`` blocks; hit blocks are touched (pinned, off the free queue);
  ``num_cached_tokens`` is fixed at the first admission (vLLM's ``Request.num_cached_tokens``);
* **caching**: after every forward, every newly full block of prompt + output gets its key, so
  ``(prompt + output - 1) // block_size`` blocks end up cached (the last sampled token's KV is never
  computed);
* **release**: a finished, aborted or preempted sequence frees its blocks tail first (``reversed``
  block table; vLLM ``SingleTypeKVCacheManager.free``), or head first to demonstrate the bug;
* **TTL** (``ttl_s``; not in vLLM): before every lookup, free cached blocks released longer than
  ``ttl_s`` ago lose their key (:class:`kvbench.cache.pool_cache.IdleTimer`, the copy engine's
  caches' rule).

Scheduling, one step (vLLM v1 ``Scheduler.schedule``, simplified): running sequences first, in
admission order, each with its remaining tokens (1 when decoding; a prefill chunk when the token
budget ``max_num_batched_tokens`` runs short); a running sequence that cannot get a block preempts
the most recently admitted one (its blocks are freed and it rejoins the front of the waiting queue
to be recomputed, vLLM v1's preemption mode). Then, if nothing was preempted, waiting sequences are
admitted FCFS while the budget, ``max_num_seqs`` and the free blocks allow, and while the head of the
queue does not miss a block a running sequence is about to compute (it waits to hit it instead:
``Scheduler._next_block_in_flight``).

Parallel sampling (``n`` samples of one prompt, vLLM's ``SamplingParams(n=...)``): once the prompt's
prefill has run, :meth:`Scheduler.fork` gives ``n - 1`` more sequences the same block table (every
prompt block at ref count ``n``, one prefill). Each sample counts against ``max_num_seqs`` (vLLM v1
makes each sample its own request): samples beyond the cap wait at the front of the queue and are
admitted later as fresh sequences, hitting the prompt's cached blocks. **Copy-on-write**: before a sequence
writes into a
block another table also holds (the prompt's partly filled last block), :meth:`Scheduler.schedule`
gives it a fresh block and lists ``(source, destination)`` in ``ScheduledBatch.copies`` for the
engine to copy before the forward; the last sample to write finds the block at ref count 1 and
writes in place, so a prompt that ends mid-block costs ``n - 1`` copies and one ending on a block
boundary none (vLLM v0's ``BlockSpaceManager`` ``_cow_block_if_not_appendable``; the same rule as
the replay in :mod:`kvbench.memory.sharing`). Each sample frees its own table, tail first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable

from kvbench.cache.base import HEAD_FIRST_RADIX_ERROR, CacheKind, Clock
from kvbench.cache.block_hash import BlockHasher
from kvbench.cache.block_index import PoolIndex
from kvbench.cache.block_pool import BlockPool
from kvbench.cache.host_tier import HostTierIndex
from kvbench.cache.pool_cache import IdleTimer
from kvbench.engine.paged.kv_pool import NULL_BLOCK_ID

# part of this API
from kvbench.engine.paged.sequence import (
    ScheduledBatch,
    Sequence,
    SequenceStatus,
    blocks_for,
)


class Scheduler:
    """FCFS continuous batching over one :class:`BlockPool` (module docstring).

    ``hasher`` ``None`` turns prefix caching off (nothing is looked up or keyed); ``kind`` picks the
    block keys (hash or radix, :class:`~kvbench.cache.block_index.PoolIndex`). Block ids start at
    1: block 0 is the pool's null block. ``ttl_s`` (seconds on ``clock``, default ``time.monotonic``):
    see the module docstring; ``None`` = blocks leave only by eviction.

    Raises (constructor): ``ValueError`` for head-first release with the radix kind.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        hasher: BlockHasher | None,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        tail_first: bool = True,
        ttl_s: float | None = None,
        clock: Clock | None = None,
        kind: CacheKind = CacheKind.HASH,
        host_tier_blocks: int = 0,
    ) -> None:
        if CacheKind(kind) is CacheKind.RADIX and not tail_first:
            raise ValueError(HEAD_FIRST_RADIX_ERROR)
        # radix keys: no prefix
        if host_tier_blocks and (CacheKind(kind) is CacheKind.RADIX or hasher is None):
            raise ValueError("--host-tier needs the hash prefix cache on (--cache on --cache-kind hash)")
        self.pool = BlockPool(num_blocks, first_block_id=NULL_BLOCK_ID + 1)
        self.timer = IdleTimer(self.pool, ttl_s, clock)
        self.block_size = block_size
        self.index = PoolIndex(self.pool, hasher, kind) if hasher is not None else None
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self._tail_first = tail_first
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_copied_blocks = 0  # copy-on-write copies over the scheduler's life
        self.host = HostTierIndex(host_tier_blocks) if host_tier_blocks else None
        self.num_host_queried_tokens = self.num_host_hit_tokens = 0  # first admissions
        # (GPU block, host slot) of released blocks, not yet copied
        self._host_stores: list[tuple[int, int]] = []
        self._host_loads: list[tuple[int, int]] = []  # (host slot, GPU block) of this schedule's admissions

    # -- queue -------------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """Pick this step's sequences and allocate their blocks (module docstring)."""
        budget, items, preempted, copies = self.max_num_batched_tokens, [], [], []
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_pending_tokens, budget)
            if not self._grow_or_preempt(seq, num_new, preempted, copies):
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
        stores, loads, self._host_stores, self._host_loads = (
            tuple(self._host_stores),
            tuple(self._host_loads),
            [],
            [],
        )
        return ScheduledBatch(tuple(items), tuple(preempted), tuple(copies), stores, loads)

    def _grow_or_preempt(
        self, seq: Sequence, num_new: int, preempted: list[Sequence], copies: list[tuple[int, int]]
    ) -> bool:
        """Give ``seq`` blocks for ``num_new`` more tokens (and a private copy of a shared block it
        writes into), preempting from the back; ``False`` if ``seq`` itself had to go."""
        while True:
            shared = self._shared_write_block(seq)  # a preemption may have left seq its only holder
            need = blocks_for(seq.num_computed_tokens + num_new, self.block_size) - len(seq.block_table)
            if self.pool.can_allocate(need + (shared is not None)):
                break
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        if shared is not None:
            source = seq.block_table[shared]
            (destination,) = self.pool.allocate(1)
            self.pool.free([source])  # one holder less; the others keep it
            seq.block_table[shared] = destination
            copies.append((source, destination))
            seq.num_copied_blocks += 1
            self.num_copied_blocks += 1
        seq.block_table.extend(self.pool.allocate(need))
        return True

    def _shared_write_block(self, seq: Sequence) -> int | None:
        """The index in ``seq``'s table of the block its next token goes into, if another table holds
        it too (ref count > 1: copy before writing); else ``None``."""
        index = seq.num_computed_tokens // self.block_size
        if index < len(seq.block_table) and self.pool.ref_count(seq.block_table[index]) > 1:
            return index
        return None

    def fork(self, parent: Sequence, children: Iterable[Sequence]) -> list[Sequence]:
        """Start ``children`` (fresh sequences of ``parent``'s prompt) as parallel samples sharing
        ``parent``'s blocks: each gets its block table, computed tokens and cached-token count, and
        one more ref on every block (module docstring). ``parent`` must be running with nothing
        sampled yet. Children beyond ``max_num_seqs`` running wait at the front of the queue, in order.

        Returns the children started now (the others run their own prefill once admitted).

        Raises:
            ValueError: ``parent`` is not running, has output tokens or pending tokens, or a child is
                not a fresh sequence of the same prompt.
        """
        if (
            parent.status is not SequenceStatus.RUNNING
            or parent.num_pending_tokens
            or parent.num_tokens != parent.num_prompt_tokens
        ):
            raise ValueError(
                f"sequence {parent.seq_id} must be running with its prompt computed and nothing sampled"
            )
        children = list(children)
        for child in children:
            if (
                child.status is not SequenceStatus.WAITING
                or child.block_table
                or child.token_ids != parent.token_ids
            ):
                raise ValueError(
                    f"sequence {child.seq_id} is not a fresh sample of sequence {parent.seq_id}'s prompt"
                )
        started = children[: max(self.max_num_seqs - len(self.running), 0)]
        for child in started:
            self.pool.touch(parent.block_table)
            child.block_table = list(parent.block_table)
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_tokens = parent.num_cached_tokens
            child._num_keyed_blocks, child._block_keys = parent._num_keyed_blocks, list(parent._block_keys)
            child.status = SequenceStatus.RUNNING
            self.running.append(child)
        self.waiting.extendleft(reversed(children[len(started) :]))
        return started

    def _admit(self, seq: Sequence, budget: int) -> tuple[Sequence, int] | None:
        """Look up, pin the hit, allocate the first chunk; ``None`` (changing nothing) if it does not fit."""
        hit = self._lookup(seq)
        slots = self._host_prefix(seq, len(hit))
        if self._next_block_in_flight(seq, len(hit) + len(slots)):
            return None
        num_hit_tokens = (len(hit) + len(slots)) * self.block_size
        num_new = min(seq.num_tokens - num_hit_tokens, budget)
        need = blocks_for(num_hit_tokens + num_new, self.block_size) - len(hit)
        num_evictable_hits = sum(self.pool.ref_count(b) == 0 for b in hit)
        if need + num_evictable_hits > self.pool.num_free_blocks:
            return None
        self.pool.touch(hit)
        seq.block_table = hit + self.pool.allocate(need)
        seq.num_computed_tokens = num_hit_tokens
        seq._num_keyed_blocks = len(hit)
        self._load_from_host(seq, slots)
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = num_hit_tokens
            if self.host is not None:
                seq.num_host_cached_tokens = len(slots) * self.block_size
                self.num_host_queried_tokens += seq.num_prompt_tokens
                self.num_host_hit_tokens += seq.num_host_cached_tokens
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
        index, wanted = self.index, num_hit_blocks
        if index is None or not self.running or wanted >= (seq.num_tokens - 1) // self.block_size:
            return False
        keys = self._keys(seq)
        return any(
            other.salt == seq.salt
            and other._num_keyed_blocks <= wanted < other.num_tokens // self.block_size
            and index.same_prefix(keys, self._keys(other), wanted)
            for other in self.running
        )

    def _lookup(self, seq: Sequence) -> list[int]:
        if self.index is None:
            return []
        self.timer.sweep()
        return self.index.cached_prefix(self._keys(seq)[: (seq.num_tokens - 1) // self.block_size], seq.salt)

    def host_tier_counters(self) -> tuple[int, int] | None:
        """``(queried, hit)`` host-tier prompt tokens (every admitted one is queried); ``None`` without a
        tier."""
        return None if self.host is None else (self.num_host_queried_tokens, self.num_host_hit_tokens)

    def _host_prefix(self, seq: Sequence, num_hit_blocks: int) -> list[int]:
        """Host-tier slots of the blocks that continue ``seq``'s GPU hit, up to the last-token cap."""
        cap = (seq.num_tokens - 1) // self.block_size
        return [] if self.host is None else self.host.cached_prefix(self._keys(seq)[num_hit_blocks:cap])

    def _load_from_host(self, seq: Sequence, slots: list[int]) -> None:
        """The blocks after ``seq``'s GPU hit get the tier's K/V (copied before the forward) and keys."""
        keys = self._keys(seq) if slots else []
        for slot in slots:
            index = seq._num_keyed_blocks
            self._host_loads.append((slot, seq.block_table[index]))
            seq.num_inserted_blocks += self.index.key_block(
                seq.block_table, index, keys, seq.salt, seq.token_ids
            )
            seq._num_keyed_blocks = index + 1

    def _store_in_host(self, seq: Sequence) -> None:
        """Write-through at release: ``seq``'s keyed blocks into the tier, last first (block 0 ends most
        recent); a block the tier holds is only refreshed."""
        keys = seq._block_keys
        size = self.block_size
        for index in reversed(range(min(seq._num_keyed_blocks, len(keys)))):
            parent = keys[index - 1] if index else None
            slot = self.host.store(keys[index], parent, seq.token_ids[index * size : (index + 1) * size])
            if slot is not None:
                self._host_stores.append((seq.block_table[index], slot))

    def _keys(self, seq: Sequence) -> list[Hashable]:
        """Keys of every full block of ``seq.token_ids`` (recomputed only when a block has filled)."""
        num_full = seq.num_tokens // self.block_size
        if len(seq._block_keys) < num_full:
            seq._block_keys = self.index.block_keys(seq.token_ids[: num_full * self.block_size], seq.salt)
        return seq._block_keys

    # -- after a forward ---------------------------------------------------------------------------

    def computed(self, seq: Sequence, num_new: int) -> None:
        """``num_new`` more tokens of ``seq`` now have K/V in the pool: key its newly full blocks."""
        seq.num_computed_tokens += num_new
        if self.index is None:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq._num_keyed_blocks:
            return
        keys = self._keys(seq)
        for index in range(seq._num_keyed_blocks, num_full):
            seq.num_inserted_blocks += self.index.key_block(
                seq.block_table, index, keys, seq.salt, seq.token_ids
            )
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
        if self.host is not None:
            self._store_in_host(seq)
        table = seq.block_table
        self.timer.released(self.pool.free(reversed(table) if self._tail_first else table))
        seq.block_table = []
        seq._num_keyed_blocks = 0

    # -- checking ----------------------------------------------------------------------------------

    def check_invariants(self, live: Iterable[Sequence] = ()) -> None:
        """Raise ``AssertionError`` unless the pool agrees with the block tables: every block's ref
        count is the number of running tables holding it (no leaked or missing pin), waiting and
        finished sequences hold nothing, and the pool's (and the index's) own invariants hold."""
        (self.index or self.pool).check_invariants()
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
