"""A paged KV block manager: block tables, ref counts, fork and copy-on-write. No torch.

PagedAttention (Kwon et al., SOSP'23, section 4) stores each sequence's KV in fixed-size blocks
that need not be adjacent; a per-sequence *block table* maps logical block i -> physical block id,
as a page table maps virtual pages to frames. Blocks are taken from a free list only when a
sequence needs one, so a sequence wastes less than one block (its partly filled last block).

Sharing inside one request (parallel samples, beams): :meth:`BlockManager.fork` gives a child a
copy of the parent's *table* and adds one to every block's ref count; no KV moves. Full blocks are
never written again, so they stay shared for good. Before a sequence writes into its partly filled
last block while that block's ref count is above one, :meth:`BlockManager.append` copies it
(copy-on-write): it takes a free block, points the table at it, drops the old block's count, and
reports the copy as a :class:`BlockCopy` for an engine to execute. The last sequence still pointing
at the old block writes into it in place. A sequence that is freed only drops counts; a block whose
count reaches zero goes back to the free list.

State is plain ints: ref counts and the free list live in a :class:`~kvbench.cache.block_pool.BlockPool`
(nano-vllm's FIFO: allocation from the front, release to the back, never-used ids first), plus
``_block_tables[seq_id]`` and ``_num_tokens[seq_id]``. The pool hands ids out lazily, so memory grows
with the blocks touched, not with the pool (a 1 TiB pool of 128 KiB blocks is 8 million ids).
Derived counts are properties.
:meth:`BlockManager.check_invariants` verifies the whole state; randomized tests call it after
every operation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from kvbench.cache.block_pool import BlockPool, OutOfBlocksError

__all__ = ["AppendResult", "BlockCopy", "BlockManager", "BlockManagerConfig", "OutOfBlocksError", "SeqId"]

SeqId = Hashable  # any hashable id: request id, (request, sample) pair, ...


@dataclass(frozen=True)
class BlockManagerConfig:
    """Size of a block pool.

    Attributes:
        num_blocks: physical blocks in the pool; positive.
        block_size: tokens per block; positive (16 is vLLM's default).
    """

    num_blocks: int
    block_size: int = 16  # vLLM's default block size

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class BlockCopy:
    """One copy-on-write: the engine must copy block ``source_block_id`` into ``target_block_id``."""

    source_block_id: int
    target_block_id: int


@dataclass(frozen=True)
class AppendResult:
    """What :meth:`BlockManager.append` changed.

    Attributes:
        new_block_ids: blocks taken from the free list for new tokens (not counting copies).
        copies: copy-on-write copies made before writing (at most one: the shared last block).
    """

    new_block_ids: tuple[int, ...]
    copies: tuple[BlockCopy, ...]


class BlockManager:
    """Block tables over a fixed pool of physical blocks, with ref counts and copy-on-write.

    Method pairs read as sentences: ``can_allocate`` / ``allocate``, ``can_append`` / ``append``,
    ``fork``, ``free``. The ``can_*`` checks never change state; the actions raise
    :class:`OutOfBlocksError` when the pool is short (and then change nothing), ``KeyError`` for an
    unknown sequence and ``ValueError`` for a sequence id already in use or a bad token count.
    """

    def __init__(self, config: BlockManagerConfig) -> None:
        self.config = config
        # never-used ids, then released ones
        self.pool = BlockPool(config.num_blocks, reuse_freed_first=False)
        self._block_tables: dict[SeqId, list[int]] = {}
        self._num_tokens: dict[SeqId, int] = {}
        self.num_copies = 0  # copy-on-write copies made so far
        self.peak_used_blocks = 0

    # -- reading state ---------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.config.num_blocks - self.num_free_blocks

    @property
    def num_shared_blocks(self) -> int:
        """Blocks that more than one block table points at (ref count > 1); O(blocks handed out)."""
        return sum(1 for block_id in self.pool.used_block_ids() if self.pool.ref_count(block_id) > 1)

    @property
    def seq_ids(self) -> tuple[SeqId, ...]:
        return tuple(self._block_tables)

    def block_table(self, seq_id: SeqId) -> tuple[int, ...]:
        """Physical block ids of ``seq_id``'s logical blocks 0, 1, ...; raises ``KeyError``."""
        return tuple(self._table(seq_id))

    def num_seq_blocks(self, seq_id: SeqId) -> int:
        """Length of ``seq_id``'s block table (without copying it)."""
        return len(self._table(seq_id))

    def num_tokens(self, seq_id: SeqId) -> int:
        self._table(seq_id)
        return self._num_tokens[seq_id]

    def ref_count(self, block_id: int) -> int:
        """Tables pointing at ``block_id`` (0 for a free block); raises ``IndexError`` outside the pool."""
        return self.pool.ref_count(block_id)

    # -- allocation --------------------------------------------------------------------------------

    def num_blocks_to_allocate(self, num_tokens: int) -> int:
        """Blocks a new sequence of ``num_tokens`` tokens takes: ``ceil(num_tokens / block_size)``."""
        _check_count(num_tokens, minimum=0)
        return math.ceil(num_tokens / self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.num_blocks_to_allocate(num_tokens) <= self.num_free_blocks

    def allocate(self, seq_id: SeqId, num_tokens: int) -> tuple[int, ...]:
        """Start ``seq_id`` with ``num_tokens`` tokens (a prompt) in fresh blocks; returns its table."""
        if seq_id in self._block_tables:
            raise ValueError(f"sequence {seq_id!r} already has a block table")
        num_blocks = self.num_blocks_to_allocate(num_tokens)
        self._require_free(num_blocks)
        self._block_tables[seq_id] = self._take_free_blocks(num_blocks)
        self._num_tokens[seq_id] = num_tokens
        return tuple(self._block_tables[seq_id])

    def num_blocks_to_append(self, seq_id: SeqId, num_tokens: int = 1) -> int:
        """Free blocks ``append(seq_id, num_tokens)`` takes: new blocks plus a copy-on-write copy."""
        _check_count(num_tokens, minimum=1)
        table = self._table(seq_id)
        length = self._num_tokens[seq_id]
        num_new = math.ceil((length + num_tokens) / self.block_size) - len(table)
        return num_new + int(self._writes_shared_block(table, length))

    def can_append(self, seq_id: SeqId, num_tokens: int = 1) -> bool:
        return self.num_blocks_to_append(seq_id, num_tokens) <= self.num_free_blocks

    def append(self, seq_id: SeqId, num_tokens: int = 1) -> AppendResult:
        """Add ``num_tokens`` tokens to ``seq_id``: copy a shared partial last block first, then take
        new blocks as the tokens cross block boundaries."""
        self._require_free(self.num_blocks_to_append(seq_id, num_tokens))
        table = self._block_tables[seq_id]
        length = self._num_tokens[seq_id]
        copies: tuple[BlockCopy, ...] = ()
        if self._writes_shared_block(table, length):
            source = table[-1]
            table[-1] = self._take_free_blocks(1)[0]
            self.pool.free([source])  # still pointed at by another table: stays used
            self.num_copies += 1
            copies = (BlockCopy(source, table[-1]),)
        num_new = math.ceil((length + num_tokens) / self.block_size) - len(table)
        new_block_ids = tuple(self._take_free_blocks(num_new))
        table.extend(new_block_ids)
        self._num_tokens[seq_id] = length + num_tokens
        return AppendResult(new_block_ids, copies)

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        """Give ``child_id`` the parent's blocks (shared, ref count + 1 each); copies no KV."""
        if child_id in self._block_tables:
            raise ValueError(f"sequence {child_id!r} already has a block table")
        table = self._table(parent_id)
        self.pool.touch(table)
        self._block_tables[child_id] = list(table)
        self._num_tokens[child_id] = self._num_tokens[parent_id]

    def free(self, seq_id: SeqId) -> tuple[int, ...]:
        """Drop ``seq_id``: each of its blocks loses one ref; returns the blocks that became free.

        Blocks are released last block first, the order vLLM uses so that a prefix cache evicts a
        chain's tail before its head."""
        table = self._table(seq_id)
        released = self.pool.free(reversed(table))
        del self._block_tables[seq_id]
        del self._num_tokens[seq_id]
        return tuple(released)

    # -- checking ----------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` unless the state is consistent:

        * every block's ref count equals the number of block tables pointing at it;
        * the free list holds exactly the handed-out blocks at ref count 0, each once;
        * no table points at one block twice, and each table has ``ceil(num_tokens / block_size)``
          blocks.
        """
        pointers: Counter[int] = Counter()
        for seq_id, table in self._block_tables.items():
            if len(set(table)) != len(table):
                raise AssertionError(f"sequence {seq_id!r} points at a block twice: {table}")
            expected = math.ceil(self._num_tokens[seq_id] / self.block_size)
            if len(table) != expected:
                raise AssertionError(
                    f"sequence {seq_id!r}: {len(table)} blocks for "
                    f"{self._num_tokens[seq_id]} tokens (expected {expected})"
                )
            pointers.update(table)
        for block_id in set(pointers) | set(self.pool.used_block_ids()):
            ref_count = self.pool.ref_count(block_id)
            if ref_count != pointers[block_id]:
                raise AssertionError(
                    f"block {block_id}: ref count {ref_count}, {pointers[block_id]} tables point at it"
                )
        self.pool.check_invariants()

    # -- internals ---------------------------------------------------------------------------------

    def _table(self, seq_id: SeqId) -> list[int]:
        try:
            return self._block_tables[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r}") from None

    def _writes_shared_block(self, table: list[int], length: int) -> bool:
        """Whether the next token lands in a partly filled last block that other tables share."""
        return length % self.block_size != 0 and self.pool.ref_count(table[-1]) > 1

    def _require_free(self, num_blocks: int) -> None:
        if num_blocks > self.num_free_blocks:
            raise OutOfBlocksError(f"need {num_blocks} free blocks, have {self.num_free_blocks}")

    def _take_free_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks off the front of the free list at ref count 1 (caller checked)."""
        block_ids = self.pool.allocate(num_blocks)
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
        return block_ids


def _check_count(num_tokens: int, minimum: int) -> None:
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < minimum:
        raise ValueError(f"num_tokens must be an integer >= {minimum}, got {num_tokens!r}")
