"""One request's sequence inside the paged engine (:class:`Sequence`: its tokens, block table and
counts), its status, and one scheduling step's work (:class:`ScheduledBatch`), as
:mod:`kvbench.engine.paged.scheduler` moves them. Pure Python."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field


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
        num_copied_blocks: copy-on-write copies this sequence made (:mod:`kvbench.engine.paged.scheduler`).
        num_host_cached_tokens: of ``num_cached_tokens``, the tokens loaded from the host tier.
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
    num_copied_blocks: int = 0
    num_host_cached_tokens: int | None = None
    _num_keyed_blocks: int = 0  # leading blocks of the table known to hold their key
    _block_keys: list[Hashable] = field(default_factory=list)  # PoolIndex.block_keys of the full blocks

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to compute before the next sample (the whole rest of a prefill, or 1)."""
        return self.num_tokens - self.num_computed_tokens


@dataclass(frozen=True)
class ScheduledBatch:
    """One step's work: ``(sequence, tokens to compute)`` pairs in admission order, who was
    preempted to make room, and the copies to make before the forward, in this order: host-tier
    stores ``(GPU block, host slot)`` of released blocks, host-tier loads ``(host slot, GPU block)``
    of admitted hits, copy-on-write copies ``(source block, destination block)``."""

    items: tuple[tuple[Sequence, int], ...]
    preempted: tuple[Sequence, ...] = ()
    copies: tuple[tuple[int, int], ...] = ()
    host_stores: tuple[tuple[int, int], ...] = ()
    host_loads: tuple[tuple[int, int], ...] = ()


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)
