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

State is plain ints: ``_ref_counts[block_id]``, ``_free_block_ids`` (a deque, allocation from the
front, release to the back), ``_block_tables[seq_id]`` and ``_num_tokens[seq_id]``. Block ids are
handed out lazily: ids never used yet (``len(_ref_counts)`` and up) sit conceptually at the front
of the free list, so memory grows with the blocks touched, not with the pool (a 1 TiB pool of
128 KiB blocks is 8 million ids). Derived counts are properties.
:meth:`BlockManager.check_invariants` verifies the whole state; randomized tests call it after
every operation.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass

SeqId = Hashable  # any hashable id: request id, (request, sample) pair, ...


class OutOfBlocksError(RuntimeError):
    """An allocate / append / copy needed more free blocks than there are (check ``can_*`` first)."""


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
        self._ref_counts: list[int] = []  # one entry per block id handed out so far
        self._free_block_ids: deque[int] = deque()  # released blocks, reused after never-used ones
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
        return self._num_never_used_blocks + len(self._free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.config.num_blocks - self.num_free_blocks

    @property
    def num_shared_blocks(self) -> int:
        """Blocks that more than one block table points at (ref count > 1); O(blocks handed out)."""
        return sum(1 for ref_count in self._ref_counts if ref_count > 1)

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
        if not 0 <= block_id < self.config.num_blocks:
            raise IndexError(f"block {block_id} is outside the pool of {self.config.num_blocks}")
        return self._ref_counts[block_id] if block_id < len(self._ref_counts) else 0

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
            self._ref_counts[source] -= 1  # still > 0: another table points at it
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
        for block_id in table:
            self._ref_counts[block_id] += 1
        self._block_tables[child_id] = list(table)
        self._num_tokens[child_id] = self._num_tokens[parent_id]

    def free(self, seq_id: SeqId) -> tuple[int, ...]:
        """Drop ``seq_id``: each of its blocks loses one ref; returns the blocks that became free.

        Blocks are released last block first, the order vLLM uses so that a prefix cache evicts a
        chain's tail before its head."""
        table = self._table(seq_id)
        ref_counts = self._ref_counts  # a local name: this loop is the replay's hot spot
        released = []
        for block_id in reversed(table):
            ref_counts[block_id] -= 1
            if not ref_counts[block_id]:
                released.append(block_id)
        self._free_block_ids.extend(released)
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
                raise AssertionError(f"sequence {seq_id!r}: {len(table)} blocks for "
                                     f"{self._num_tokens[seq_id]} tokens (expected {expected})")
            pointers.update(table)
        if pointers and max(pointers) >= len(self._ref_counts):
            raise AssertionError(f"a table points at block {max(pointers)}, never handed out")
        for block_id, ref_count in enumerate(self._ref_counts):
            if ref_count != pointers[block_id]:
                raise AssertionError(f"block {block_id}: ref count {ref_count}, "
                                     f"{pointers[block_id]} tables point at it")
        free = set(self._free_block_ids)
        if len(free) != len(self._free_block_ids):
            raise AssertionError("a block is on the free list twice")
        at_zero = {block_id for block_id, ref in enumerate(self._ref_counts) if ref == 0}
        if free != at_zero:
            raise AssertionError(f"free list and ref counts disagree: free and referenced "
                                 f"{sorted(free - at_zero)}, unreferenced but not free "
                                 f"{sorted(at_zero - free)}")

    # -- internals ---------------------------------------------------------------------------------

    def _table(self, seq_id: SeqId) -> list[int]:
        try:
            return self._block_tables[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id!r}") from None

    def _writes_shared_block(self, table: list[int], length: int) -> bool:
        """Whether the next token lands in a partly filled last block that other tables share."""
        return length % self.block_size != 0 and self._ref_counts[table[-1]] > 1

    def _require_free(self, num_blocks: int) -> None:
        if num_blocks > self.num_free_blocks:
            raise OutOfBlocksError(f"need {num_blocks} free blocks, have {self.num_free_blocks}")

    @property
    def _num_never_used_blocks(self) -> int:
        return self.config.num_blocks - len(self._ref_counts)

    def _take_free_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks off the front of the free list at ref count 1 (caller checked):
        never-used ids first, then released blocks in release order."""
        ref_counts = self._ref_counts
        num_new = min(num_blocks, self._num_never_used_blocks)
        block_ids = list(range(len(ref_counts), len(ref_counts) + num_new))
        ref_counts.extend([1] * num_new)
        pop = self._free_block_ids.popleft
        reused = [pop() for _ in range(num_blocks - num_new)]
        for block_id in reused:
            ref_counts[block_id] = 1
        block_ids += reused
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
        return block_ids


def _check_count(num_tokens: int, minimum: int) -> None:
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < minimum:
        raise ValueError(f"num_tokens must be an integer >= {minimum}, got {num_tokens!r}")
