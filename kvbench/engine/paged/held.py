"""Measured KV memory of the paged engine: the bytes its pool holds for running and cached blocks.

The pool's tensors are allocated once (``KVPool.allocated_bytes``); what a run *uses* of them is the
blocks some block table points at (**running**: ref count > 0; a block shared by several tables
counts once) plus the free blocks that still hold a key (**cached**: a later request can hit them;
vLLM's evictable blocks). :class:`PoolMeter` reads both after every schedule, when the step's blocks
are allocated and before finished sequences free theirs, so its peaks are the step peaks.

**Unfilled slots** (internal fragmentation, what ``kvbench memory waste`` replays): token slots of
running blocks that hold no token yet, counting the tokens the scheduled step writes; a shared block
counts once. Cached blocks are full (only full blocks get a key), so they add none.

**The copy engine's design, for the same steps** (``copy_engine_bytes``): what
:class:`~kvbench.engine.engine.HFEngine` would hold for the same blocks and running sequences: every
held block as its own tensor, plus a contiguous copy of each running sequence's K/V (its tokens x KV
bytes per token; a hit is copied out of the blocks, so the prefix sits in memory twice). Computed
from the token counts, not measured on a copy engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class HeldKV:
    """One reading (or the peaks) of a paged engine's pool, bytes (K and V of every layer).

    Attributes:
        running_bytes: blocks some running sequence's block table points at.
        cached_bytes: free blocks still holding a key (hits for later requests; evicted lazily).
        held_bytes: ``running_bytes + cached_bytes``.
        unfilled_bytes: running blocks' slots that hold no token (module docstring).
        pool_bytes: the pool's preallocated tensors (``KVPool.allocated_bytes``, null block included).
        copy_engine_bytes: ``held_bytes`` plus a contiguous copy of every running sequence (module
            docstring).
    """

    running_bytes: int
    cached_bytes: int
    held_bytes: int
    unfilled_bytes: int
    pool_bytes: int
    copy_engine_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class PoolMeter:
    """A pool's readings over a run (module docstring): the one at the step where the held bytes
    peaked, and the peaks of the running blocks and of the unfilled slots on their own.

    ``bytes_per_block``: ``KVPool.bytes_per_block``; ``pool_bytes``: ``KVPool.allocated_bytes``.
    """

    def __init__(self, bytes_per_block: int, pool_bytes: int) -> None:
        self.bytes_per_block, self.pool_bytes = bytes_per_block, pool_bytes
        self.at_peak = HeldKV(0, 0, 0, 0, pool_bytes)
        self.peak_running_bytes = self.peak_unfilled_bytes = self.peak_copy_engine_bytes = 0
        self.num_steps = self.sum_running_bytes = self.sum_unfilled_bytes = 0  # for means over steps

    def observe(self, scheduler, scheduled: dict[int, int]) -> None:
        """Read ``scheduler``'s pool after a schedule; ``scheduled``: seq_id -> tokens this step writes."""
        reading = self.now(scheduler, scheduled)
        if reading.held_bytes > self.at_peak.held_bytes:
            self.at_peak = reading
        self.peak_running_bytes = max(self.peak_running_bytes, reading.running_bytes)
        self.peak_unfilled_bytes = max(self.peak_unfilled_bytes, reading.unfilled_bytes)
        self.peak_copy_engine_bytes = max(self.peak_copy_engine_bytes, reading.copy_engine_bytes)
        self.num_steps += 1
        self.sum_running_bytes += reading.running_bytes
        self.sum_unfilled_bytes += reading.unfilled_bytes

    def now(self, scheduler, scheduled: dict[int, int] | None = None) -> HeldKV:
        """The pool as it is (at the end of a run: what stays cached); ``scheduled`` as in :meth:`observe`."""
        pool, per_block = scheduler.pool, self.bytes_per_block
        running, cached = pool.num_used_blocks * per_block, pool.num_evictable_blocks * per_block
        unfilled_slots, num_tokens = _slots(scheduler, scheduled or {})
        per_token = per_block // scheduler.block_size
        return HeldKV(
            running,
            cached,
            running + cached,
            unfilled_slots * per_token,
            self.pool_bytes,
            running + cached + num_tokens * per_token,
        )

    def summary(self, scheduler) -> dict[str, int]:
        """The run's memory keys (bytes): ``peak_held_kv_bytes``, ``peak_running_kv_bytes``,
        ``peak_unfilled_kv_bytes``, ``end_held_kv_bytes``, ``end_cached_kv_bytes``, ``pool_bytes``,
        and ``peak_copy_engine_kv_bytes`` (the copy engine's design for the same steps, computed)."""
        end = self.now(scheduler)
        return {
            "peak_held_kv_bytes": self.at_peak.held_bytes,
            "peak_running_kv_bytes": self.peak_running_bytes,
            "peak_unfilled_kv_bytes": self.peak_unfilled_bytes,
            "end_held_kv_bytes": end.held_bytes,
            "end_cached_kv_bytes": end.cached_bytes,
            "pool_bytes": self.pool_bytes,
            "peak_copy_engine_kv_bytes": self.peak_copy_engine_bytes,
        }


def _slots(scheduler, scheduled: dict[int, int]) -> tuple[int, int]:
    """Slots of running blocks that no token fills once the ``scheduled`` tokens are written, and the
    running sequences' tokens with K/V by then (summed over sequences: shared blocks count per holder)."""
    block_size, seen, unfilled, total = scheduler.block_size, set(), 0, 0
    for seq in scheduler.running:
        num_tokens = seq.num_computed_tokens + scheduled.get(seq.seq_id, 0)
        total += num_tokens
        for index in range(num_tokens // block_size, len(seq.block_table)):  # the blocks before are full
            block_id = seq.block_table[index]
            if block_id not in seen:
                seen.add(block_id)
                unfilled += (index + 1) * block_size - max(num_tokens, index * block_size)
    return unfilled, total
