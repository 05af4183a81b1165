"""The event loop of ``kvbench memory waste``: one trace, one allocator, decode steps as the clock.

Rules of the replay are in :mod:`kvbench.memory.waste`. The loop jumps from event step to
event step (an arrival, a release, a paged sequence crossing a block boundary, the step after a
preemption); in between, KV held grows by one token per running sequence per step and nothing else
changes, so time integrals are exact sums, not samples. Heaps hold stale entries after a
preemption; an entry is live only while its sequence's ``epoch`` still matches.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvbench.memory.allocators import ContiguousAllocator, KvAllocator, PagedAllocator
from kvbench.memory.waste import (
    WasteConfig,
    WasteRequest,
    WasteResult,
    WasteStats,
    WasteTimeline,
)


def replay_waste(requests: list[WasteRequest], config: WasteConfig) -> WasteResult:
    """Replay ``requests`` (sorted here by arrival; ties keep list order) through both allocators.

    Raises:
        ValueError: every request exceeds ``config.max_model_len``.
    """
    servable = [request for request in requests if not config.is_too_long(request)]
    if not servable:
        raise ValueError(f"all {len(requests)} requests exceed max_model_len {config.max_model_len}")
    contiguous = Replay(config, ContiguousAllocator(config.pool_tokens), servable).run()
    paged = Replay(config, PagedAllocator(config.num_blocks, config.block_size), servable).run()
    return WasteResult(config, len(requests), len(requests) - len(servable), contiguous, paged)


@dataclass(eq=False)
class _Sequence:
    """A request's life in one replay (mutable; ``epoch`` changes on every admission and preemption)."""

    seq_id: int
    request: WasteRequest
    slab_tokens: int
    arrival_step: int
    num_generated: int = 0  # tokens generated before the current admission
    admit_step: int = 0
    admit_order: int = 0
    first_admit_step: int | None = None
    epoch: int = 0
    is_waiting: bool = False

    @property
    def base_tokens(self) -> int:
        """KV held at admission: the prompt plus tokens generated before (all prefilled)."""
        return self.request.prompt_tokens + self.num_generated

    @property
    def end_step(self) -> int:
        return self.admit_step + self.request.output_tokens - self.num_generated

    def holding_tokens(self, step: int) -> int:
        return self.base_tokens + step - self.admit_step


@dataclass
class _Totals:
    """Time sums (value x decode steps) and peaks of the recorded state."""

    holding_token_steps: int = 0
    reserved_token_steps: int = 0
    running_seq_steps: int = 0
    stranded_token_steps: int = 0
    blocked_steps: int = 0
    peak_holding_tokens: int = 0
    peak_reserved_tokens: int = 0
    peak_stranded_tokens: int = 0


class Replay:
    """Replays servable requests through one allocator; :meth:`run` once."""

    def __init__(self, config: WasteConfig, allocator: KvAllocator, requests: list[WasteRequest]) -> None:
        self.config = config
        self.allocator = allocator
        step_ms = config.step_ms
        sequences = [
            _Sequence(
                index,
                request,
                config.reservation_tokens(request),
                math.ceil(request.arrival_ms / step_ms - 1e-9),
            )
            for index, request in enumerate(requests)
        ]
        peak_need = [
            allocator.admission_tokens(
                seq.slab_tokens, seq.request.prompt_tokens + seq.request.output_tokens - 1
            )
            for seq in sequences
        ]
        fits = [need <= allocator.capacity_tokens for need in peak_need]
        self.num_never_fit = fits.count(False)
        self.sequences = sequences  # indexed by seq_id
        arriving = [seq for seq, fit in zip(sequences, fits) if fit]
        self.arrivals = deque(sorted(arriving, key=lambda seq: (seq.arrival_step, seq.seq_id)))
        self.served: list[_Sequence] = []
        self.waiting: deque[_Sequence] = deque()
        self.running: dict[int, _Sequence] = {}  # in admission order: the last is the newest
        self.ends: list[tuple[int, int, int]] = []  # (end step, seq_id, epoch)
        self.growths: list[tuple[int, int, int, int]] = []  # (step, admit_order, seq_id, epoch)
        self.needs: list[tuple[int, int, int]] = []  # (admission tokens, seq_id, epoch), waiting
        self.wake_step: int | None = None
        self.offset_tokens = 0  # sum of (base_tokens - admit_step) over running: held = this + R*step
        self.num_admissions = 0
        self.peak_running = 0
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.max_waste_tokens = 0
        self.totals = _Totals()
        self.records: list[tuple[int, int, int, int]] = []  # (step, held, reserved, running)

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> WasteStats:
        first_step = self.arrivals[0].arrival_step if self.arrivals else 0
        previous: tuple[int, int, int, int, int, bool] | None = None
        step = first_step
        while self.arrivals or self.running or self.waiting:
            step = self._next_step()
            if previous is not None:
                self._integrate(previous, step - previous[0])
            self._release_finished(step)
            preempted = self._grow_running(step)
            while self.arrivals and self.arrivals[0].arrival_step == step:
                self._enqueue(self.arrivals.popleft(), front=False)
            if preempted:
                self.wake_step = step + 1
            else:
                self._admit_waiting(step)
            previous = self._record(step)
        return self._stats(step - first_step)

    def _next_step(self) -> int:
        candidates = []
        if self.arrivals:
            candidates.append(self.arrivals[0].arrival_step)
        while self.ends and not self._is_live(self.ends[0][1], self.ends[0][2]):
            heapq.heappop(self.ends)
        while self.growths and not self._is_live(self.growths[0][2], self.growths[0][3]):
            heapq.heappop(self.growths)
        candidates += [heap[0][0] for heap in (self.ends, self.growths) if heap]
        if self.wake_step is not None:
            candidates.append(self.wake_step)
            self.wake_step = None
        if not candidates:
            raise RuntimeError("replay stalled: requests wait but nothing runs or arrives")
        return min(candidates)

    def _is_live(self, seq_id: int, epoch: int) -> bool:
        seq = self.running.get(seq_id)
        return seq is not None and seq.epoch == epoch

    # -- events ------------------------------------------------------------------------------------

    def _release_finished(self, step: int) -> None:
        while self.ends and self.ends[0][0] == step:
            _, seq_id, epoch = heapq.heappop(self.ends)
            if self._is_live(seq_id, epoch):
                seq = self.running.pop(seq_id)
                self.allocator.release(seq_id)
                self.offset_tokens -= seq.base_tokens - seq.admit_step
                self.served.append(seq)

    def _grow_running(self, step: int) -> bool:
        """Give every sequence crossing a block boundary at ``step`` its block, oldest first;
        preempt the newest running sequence while none is free. Returns whether any was preempted."""
        preempted = False
        while self.growths and self.growths[0][0] == step:
            _, _, seq_id, epoch = heapq.heappop(self.growths)
            if not self._is_live(seq_id, epoch):
                continue
            seq = self.running[seq_id]
            while (capacity := self.allocator.grow(seq_id, seq.holding_tokens(step))) is None:
                victim = self.running[next(reversed(self.running))]
                self._preempt(victim, step)
                preempted = True
                if victim is seq:
                    break
            if capacity is not None:
                self._note_capacity(seq, step, capacity)
        return preempted

    def _preempt(self, seq: _Sequence, step: int) -> None:
        del self.running[seq.seq_id]
        self.allocator.release(seq.seq_id)
        self.offset_tokens -= seq.base_tokens - seq.admit_step
        seq.num_generated += step - seq.admit_step
        self.num_preemptions += 1
        self.num_recomputed_tokens += seq.base_tokens
        self._enqueue(seq, front=True)

    def _enqueue(self, seq: _Sequence, front: bool) -> None:
        seq.epoch += 1
        seq.is_waiting = True
        if front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)
        need = self.allocator.admission_tokens(seq.slab_tokens, seq.base_tokens)
        heapq.heappush(self.needs, (need, seq.seq_id, seq.epoch))

    def _admit_waiting(self, step: int) -> None:
        while self.waiting:
            seq = self.waiting[0]
            if not self.allocator.can_admit(seq.slab_tokens, seq.base_tokens):
                return
            self.waiting.popleft()
            seq.is_waiting = False
            seq.epoch += 1
            seq.admit_step, seq.admit_order = step, self.num_admissions
            self.num_admissions += 1
            if seq.first_admit_step is None:
                seq.first_admit_step = step
            capacity = self.allocator.admit(seq.seq_id, seq.slab_tokens, seq.base_tokens)
            self.running[seq.seq_id] = seq
            self.offset_tokens += seq.base_tokens - step
            self.peak_running = max(self.peak_running, len(self.running))
            heapq.heappush(self.ends, (seq.end_step, seq.seq_id, seq.epoch))
            self._note_capacity(seq, step, capacity)

    def _note_capacity(self, seq: _Sequence, step: int, capacity_tokens: int) -> None:
        """Track the sequence's waste and schedule its next block boundary before it ends."""
        self.max_waste_tokens = max(self.max_waste_tokens, capacity_tokens - seq.holding_tokens(step))
        next_growth = step + capacity_tokens - seq.holding_tokens(step) + 1
        if next_growth < seq.end_step:
            heapq.heappush(self.growths, (next_growth, seq.admit_order, seq.seq_id, seq.epoch))

    # -- measuring ---------------------------------------------------------------------------------

    def _record(self, step: int) -> tuple[int, int, int, int, int, bool]:
        """The state that holds from ``step`` until the next event: (step, held, reserved,
        running, stranded, head blocked by fragmentation)."""
        num_running = len(self.running)
        held = self.offset_tokens + num_running * step
        reserved = self.allocator.reserved_tokens
        stranded, blocked = 0, False
        if self.waiting:
            while self.needs and not self._is_waiting(self.needs[0][1], self.needs[0][2]):
                heapq.heappop(self.needs)
            stranded = self.allocator.stranded_tokens(self.needs[0][0])
            head = self.waiting[0]
            blocked = (
                not self.allocator.can_admit(head.slab_tokens, head.base_tokens)
                and self.allocator.admission_tokens(head.slab_tokens, head.base_tokens)
                <= self.allocator.free_tokens
            )
        self.records.append((step, held, reserved, num_running))
        return step, held, reserved, num_running, stranded, blocked

    def _is_waiting(self, seq_id: int, epoch: int) -> bool:
        seq = self.sequences[seq_id]
        return seq.is_waiting and seq.epoch == epoch

    def _integrate(self, state: tuple[int, int, int, int, int, bool], num_steps: int) -> None:
        """Add ``state`` held for ``num_steps`` steps (held grows by ``running`` each step)."""
        _, held, reserved, num_running, stranded, blocked = state
        totals = self.totals
        totals.holding_token_steps += num_steps * held + num_running * num_steps * (num_steps - 1) // 2
        totals.peak_holding_tokens = max(totals.peak_holding_tokens, held + num_running * (num_steps - 1))
        totals.reserved_token_steps += num_steps * reserved
        totals.peak_reserved_tokens = max(totals.peak_reserved_tokens, reserved)
        totals.running_seq_steps += num_steps * num_running
        totals.stranded_token_steps += num_steps * stranded
        totals.peak_stranded_tokens = max(totals.peak_stranded_tokens, stranded)
        totals.blocked_steps += num_steps if blocked else 0

    def _stats(self, num_steps: int) -> WasteStats:
        step_ms = self.config.step_ms
        totals = self.totals
        waits = [seq.first_admit_step - seq.arrival_step for seq in self.served]
        records = np.array(self.records or [(0, 0, 0, 0)], dtype=np.int64)
        span = max(num_steps, 1)
        return WasteStats(
            allocator=self.allocator.name,
            num_served=len(self.served),
            num_never_fit=self.num_never_fit,
            peak_running=self.peak_running,
            num_waited=sum(1 for wait in waits if wait > 0),
            mean_wait_ms=float(np.mean(waits)) * step_ms if waits else 0.0,
            max_wait_ms=max(waits, default=0) * step_ms,
            num_preemptions=self.num_preemptions,
            num_recomputed_tokens=self.num_recomputed_tokens,
            mean_holding_tokens=totals.holding_token_steps / span,
            peak_holding_tokens=totals.peak_holding_tokens,
            mean_reserved_tokens=totals.reserved_token_steps / span,
            peak_reserved_tokens=totals.peak_reserved_tokens,
            mean_stranded_tokens=totals.stranded_token_steps / span,
            peak_stranded_tokens=totals.peak_stranded_tokens,
            blocked_by_fragmentation_ms=totals.blocked_steps * step_ms,
            mean_waste_per_seq_tokens=(totals.reserved_token_steps - totals.holding_token_steps)
            / max(totals.running_seq_steps, 1),
            max_waste_per_seq_tokens=self.max_waste_tokens,
            makespan_ms=num_steps * step_ms,
            timeline=WasteTimeline(records[:, 0], records[:, 1], records[:, 2], records[:, 3]),
        )
