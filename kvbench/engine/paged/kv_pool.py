"""The KV pool: one preallocated key tensor and one value tensor per layer, addressed by block id.

Layout per layer and per K/V: ``(kv_heads, num_blocks + 1, block_size, head_dim)``. Block 0 is the
null block (vLLM reserves it the same way): it is never handed out and pads block tables, so a table
tensor never needs a sentinel. Heads come first so that a gather by block table,
``pool[:, block_table]``, is one copy that is already in the ``(kv_heads, seq, head_dim)`` order SDPA
reads; with vLLM's ``(num_blocks, block_size, kv_heads, head_dim)`` it would take a second copy to
transpose.
"""

from __future__ import annotations

import torch

from kvbench.memory.layout import KvLayout

NULL_BLOCK_ID = 0  # never allocated; pads block tables


class KVPool:
    """``num_blocks`` usable blocks of ``block_size`` tokens for every layer of one model.

    Bytes: ``2 x layers x kv_heads x (num_blocks + 1) x block_size x head_dim x dtype bytes``,
    allocated once here (``--cache-size`` in blocks or bytes sets ``num_blocks``).

    Raises:
        ValueError: ``num_blocks`` or ``block_size`` is not positive.
    """

    def __init__(self, layout: KvLayout, num_blocks: int, device: torch.device, dtype: torch.dtype) -> None:
        if num_blocks <= 0 or layout.block_size <= 0:
            raise ValueError(
                f"a KV pool needs positive num_blocks and block_size, got {num_blocks}, {layout.block_size}"
            )
        self.layout = layout
        self.num_blocks = num_blocks
        self.block_size = layout.block_size
        shape = (layout.num_kv_heads, num_blocks + 1, layout.block_size, layout.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layout.num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layout.num_layers)]

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block over every layer."""
        first = self.keys[0]
        return 2 * len(self.keys) * first[:, 0].numel() * first.element_size()

    @property
    def allocated_bytes(self) -> int:
        """Bytes the pool's tensors hold (the null block included)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def write(
        self,
        layer: int,
        block_ids: torch.Tensor,
        offsets: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> None:
        """Store new tokens' K/V. ``block_ids``, ``offsets``: ``(tokens,)`` long; ``keys``,
        ``values``: ``(kv_heads, tokens, head_dim)``."""
        self.keys[layer][:, block_ids, offsets] = keys  # (kv_heads, tokens, head_dim)
        self.values[layer][:, block_ids, offsets] = values

    def copy_blocks(self, copies: tuple[tuple[int, int], ...]) -> None:
        """Copy-on-write: for every ``(source, destination)`` block id pair, the destination block gets
        the source's K/V in every layer (one index copy per layer and K/V; every source is read before
        any destination is written, so the pairs may chain)."""
        if not copies:
            return
        device = self.keys[0].device
        source = torch.tensor([pair[0] for pair in copies], device=device)  # (copies,)
        destination = torch.tensor([pair[1] for pair in copies], device=device)  # (copies,)
        for pool in (*self.keys, *self.values):
            pool[:, destination] = pool[:, source]  # (kv_heads, copies, block_size, head_dim)

    def gather(
        self, layer: int, block_table: torch.Tensor, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``num_tokens`` tokens of a sequence whose blocks are ``block_table`` (``(blocks,)``
        long): keys and values, each ``(1, kv_heads, num_tokens, head_dim)`` (one copy each).

        ``index_select`` copies whole blocks (``block_size x head_dim`` contiguous values): measured
        ~13x faster than the same gather written ``pool[:, block_table]`` (1 thread, 80-block tables)."""
        k = self.keys[layer].index_select(1, block_table)  # (kv_heads, blocks, block_size, head_dim)
        v = self.values[layer].index_select(1, block_table)
        k = k.flatten(1, 2)[:, :num_tokens].unsqueeze(0)  # (1, kv_heads, num_tokens, head_dim)
        v = v.flatten(1, 2)[:, :num_tokens].unsqueeze(0)
        return k, v

    def gather_padded(
        self, layer: int, block_tables: torch.Tensor, num_sequences: int, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Several sequences at once: ``block_tables`` ``(num_sequences * max_blocks,)`` long, each
        table padded to ``max_blocks`` (with :data:`NULL_BLOCK_ID`) and flattened; keys and values
        each ``(num_sequences, kv_heads, num_tokens, head_dim)``, one copy each (a strided view of it:
        SDPA reads strides), positions past a sequence's own length hold padding to be masked."""
        num_heads, head_dim = self.layout.num_kv_heads, self.layout.head_dim
        k = self.keys[layer].index_select(1, block_tables)  # (kv_heads, n * max_blocks, block_size, head_dim)
        v = self.values[layer].index_select(1, block_tables)
        # (n, kv_heads, max_blocks * block_size, head_dim)
        k = k.view(num_heads, num_sequences, -1, head_dim).transpose(0, 1)
        v = v.view(num_heads, num_sequences, -1, head_dim).transpose(0, 1)
        return k[:, :, :num_tokens], v[:, :, :num_tokens]  # (n, kv_heads, num_tokens, head_dim)

    def block(self, block_id: int) -> torch.Tensor:
        """A copy of one block, ``(layers, 2, kv_heads, block_size, head_dim)`` (the copy engine's
        payload layout; for tests)."""
        return torch.stack(
            [torch.stack((k[:, block_id], v[:, block_id])) for k, v in zip(self.keys, self.values)]
        )


class HostKV:
    """The host tier's K/V: per layer and K/V a ``(kv_heads, capacity_blocks, block_size, head_dim)``
    tensor in CPU memory (page-locked when the pool is on CUDA, so copies to and from it are DMA
    transfers; vLLM pins its CPU swap space the same way), addressed by the slots of
    :class:`kvbench.cache.host_tier.HostTierIndex`."""

    def __init__(self, pool: KVPool, capacity_blocks: int) -> None:
        first = pool.keys[0]
        shape = (first.shape[0], capacity_blocks, first.shape[2], first.shape[3])
        pinned = first.is_cuda  # pin_memory needs CUDA; a CPU pool's tier is ordinary memory
        self.keys = [torch.zeros(shape, dtype=first.dtype, pin_memory=pinned) for _ in pool.keys]
        self.values = [torch.zeros(shape, dtype=first.dtype, pin_memory=pinned) for _ in pool.values]

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def store(self, pool: KVPool, pairs: tuple[tuple[int, int], ...]) -> None:
        """Copy GPU blocks into host slots, ``(block id, slot)`` pairs (every layer, K and V)."""
        if pairs:
            blocks = torch.tensor([pair[0] for pair in pairs], device=pool.keys[0].device)  # (pairs,)
            slots = torch.tensor([pair[1] for pair in pairs])  # (pairs,)
            for host, device in zip((*self.keys, *self.values), (*pool.keys, *pool.values)):
                host[:, slots] = device[:, blocks].cpu()  # (kv_heads, pairs, block_size, head_dim)

    def load(self, pool: KVPool, pairs: tuple[tuple[int, int], ...]) -> None:
        """Copy host slots back into GPU blocks, ``(slot, block id)`` pairs."""
        if pairs:
            slots = torch.tensor([pair[0] for pair in pairs])  # (pairs,)
            blocks = torch.tensor([pair[1] for pair in pairs], device=pool.keys[0].device)  # (pairs,)
            for host, device in zip((*self.keys, *self.values), (*pool.keys, *pool.values)):
                # (kv_heads, pairs, block_size, head_dim)
                device[:, blocks] = host[:, slots].to(device.device)
