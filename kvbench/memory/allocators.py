"""The two KV allocators that ``kvbench memory waste`` replays a trace through, in token units.

* :class:`ContiguousAllocator`: each request reserves one slab of adjacent memory for its prompt plus
  the most it may generate, first-fit in a linear address space (holes kept sorted by address and
  merged with their neighbours on release). This is how servers before PagedAttention (e.g. Orca,
  FasterTransformer) kept KV, and why the vLLM paper finds only 20.4-38.2% of their KV memory
  holding tokens (Kwon et al., SOSP'23, figure 2): over-reservation, internal and external
  fragmentation.
* :class:`PagedAllocator`: blocks on demand from a free list through a :class:`BlockManager` block
  table per sequence; a sequence only ever wastes its partly filled last block.

Both count tokens; multiply by ``KvLayout.bytes_per_token`` for bytes.
"""

from __future__ import annotations

import bisect
import math
from typing import Protocol

from kvbench.memory.block_manager import BlockManager, BlockManagerConfig


class KvAllocator(Protocol):
    """What the replay needs from an allocator. Sequences are named by int ids."""

    name: str
    capacity_tokens: int

    def admission_tokens(self, slab_tokens: int, holding_tokens: int) -> int:
        """Tokens of memory admitting a sequence takes (slab, or its blocks rounded up)."""

    def can_admit(self, slab_tokens: int, holding_tokens: int) -> bool: ...

    def admit(self, seq_id: int, slab_tokens: int, holding_tokens: int) -> int:
        """Give the sequence memory; returns how many tokens it can now hold."""

    def grow(self, seq_id: int, holding_tokens: int) -> int | None:
        """Make room for ``holding_tokens``; the new capacity, or ``None`` when memory ran out."""

    def release(self, seq_id: int) -> None: ...

    @property
    def reserved_tokens(self) -> int:
        """Memory given to sequences, tokens (slabs, or blocks x block size)."""

    @property
    def free_tokens(self) -> int: ...

    def stranded_tokens(self, min_need_tokens: int) -> int:
        """Free memory in pieces smaller than ``min_need_tokens`` (no waiting request fits there)."""


class ContiguousAllocator:
    """First-fit slabs in ``[0, capacity_tokens)``; a slab never grows or moves."""

    name = "contiguous"

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens must be positive, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self._holes: list[tuple[int, int]] = [(0, capacity_tokens)]  # (start, length) by start
        self._slabs: dict[int, tuple[int, int]] = {}
        self._reserved_tokens = 0

    @property
    def reserved_tokens(self) -> int:
        return self._reserved_tokens

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self._reserved_tokens

    @property
    def holes(self) -> tuple[tuple[int, int], ...]:
        """Free ``(start, length)`` extents in address order."""
        return tuple(self._holes)

    def admission_tokens(self, slab_tokens: int, holding_tokens: int) -> int:
        return slab_tokens

    def can_admit(self, slab_tokens: int, holding_tokens: int) -> bool:
        return any(length >= slab_tokens for _, length in self._holes)

    def admit(self, seq_id: int, slab_tokens: int, holding_tokens: int) -> int:
        for index, (start, length) in enumerate(self._holes):
            if length >= slab_tokens:  # first fit: the lowest address that is big enough
                if length == slab_tokens:
                    del self._holes[index]
                else:
                    self._holes[index] = (start + slab_tokens, length - slab_tokens)
                self._slabs[seq_id] = (start, slab_tokens)
                self._reserved_tokens += slab_tokens
                return slab_tokens
        raise RuntimeError(f"no hole of {slab_tokens} tokens (check can_admit first)")

    def grow(self, seq_id: int, holding_tokens: int) -> int | None:
        start, length = self._slabs[seq_id]
        return length if holding_tokens <= length else None

    def release(self, seq_id: int) -> None:
        start, length = self._slabs.pop(seq_id)
        self._reserved_tokens -= length
        index = bisect.bisect_left(self._holes, (start, 0))
        if index < len(self._holes) and start + length == self._holes[index][0]:
            length += self._holes.pop(index)[1]  # merge with the hole after
        if index > 0 and sum(self._holes[index - 1]) == start:
            start, before = self._holes.pop(index - 1)  # merge with the hole before
            length += before
            index -= 1
        self._holes.insert(index, (start, length))

    def stranded_tokens(self, min_need_tokens: int) -> int:
        return sum(length for _, length in self._holes if length < min_need_tokens)


class PagedAllocator:
    """Blocks on demand through a :class:`BlockManager`; any free block serves any sequence."""

    name = "paged"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.manager = BlockManager(BlockManagerConfig(num_blocks, block_size))
        self.capacity_tokens = num_blocks * block_size

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    @property
    def reserved_tokens(self) -> int:
        return self.manager.num_used_blocks * self.block_size

    @property
    def free_tokens(self) -> int:
        return self.manager.num_free_blocks * self.block_size

    def admission_tokens(self, slab_tokens: int, holding_tokens: int) -> int:
        return math.ceil(holding_tokens / self.block_size) * self.block_size

    def can_admit(self, slab_tokens: int, holding_tokens: int) -> bool:
        return self.manager.can_allocate(holding_tokens)

    def admit(self, seq_id: int, slab_tokens: int, holding_tokens: int) -> int:
        return len(self.manager.allocate(seq_id, holding_tokens)) * self.block_size

    def grow(self, seq_id: int, holding_tokens: int) -> int | None:
        num_new_tokens = holding_tokens - self.manager.num_tokens(seq_id)
        if num_new_tokens > 0:
            if not self.manager.can_append(seq_id, num_new_tokens):
                return None
            self.manager.append(seq_id, num_new_tokens)
        return self.manager.num_seq_blocks(seq_id) * self.block_size

    def release(self, seq_id: int) -> None:
        self.manager.free(seq_id)

    def stranded_tokens(self, min_need_tokens: int) -> int:
        return 0  # blocks need not be adjacent: every free block is usable by every request
