"""The sampled curve's keys from a hash-id trace's columns, vectorized: no Python object per block.

The line reader (:class:`~kvbench.workloads.formats.hash_id_keys.ChainKeys` with ``interned=False``)
mixes each prompt's ids into chained 64-bit nodes (``node_i = mix64(node_{i-1} * P + id_i)``), maps
nodes to blocks, and takes ``splitmix64(node)`` as the key, whose value is the sampling hash. This
module computes the same values with numpy over a chunk of columns
(:func:`~kvbench.workloads.formats.hash_id_columns.hash_id_column_chunks`): the chain runs one
depth at a time over every request at least that long (so a chunk costs its longest prompt in numpy
calls, not its blocks in Python steps), and only the keys under the chunk's sampling thresholds
reach Python (:meth:`~kvbench.sim.shards.ShardsPass.add_chunk`). The hashes equal the line
reader's bit for bit (``tests/sim/test_shards_columns.py``), so both paths give the same curve.
"""

from __future__ import annotations

import numpy as np

from kvbench.sim.compact_curve import chain_block_keys
from kvbench.workloads.formats.hash_id_keys import key_refusal
from kvbench.workloads.formats.mooncake import splitmix64

_CHAIN_PRIME = np.uint64(0x100000001B3)  # as hash_id_keys._mixed


def mixed_nodes(ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Chained nodes of every id prefix, as ``hash_id_keys._mixed`` per request; uint64, shape of
    ``ids``. ``ids``: non-negative ints, flat; ``offsets``: int64, shape (num_requests + 1,)."""
    counts = np.diff(offsets)
    nodes = np.empty(ids.size, dtype=np.uint64)
    order = np.argsort(-counts, kind="stable")  # longest first: depth d's requests are a prefix
    by_length, starts = counts[order], offsets[:-1][order]
    parent = np.zeros(order.size, dtype=np.uint64)
    values = ids.astype(np.uint64)
    with np.errstate(over="ignore"):
        for depth in range(int(counts.max(initial=0))):
            active = int(np.searchsorted(-by_length, -depth, side="left"))  # counts > depth
            at = starts[:active] + depth
            parent[:active] = splitmix64(parent[:active] * _CHAIN_PRIME + values[at])
            nodes[at] = parent[:active]
    return nodes


def sampling_hashes(
    ids: np.ndarray, offsets: np.ndarray, num_tokens: np.ndarray, block_size: int, block_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes, block offsets)``: every full ``block_size``-token block's sampling hash (uint64,
    :func:`kvbench.sim.shards.key_hash` of the line reader's key), request ``r``'s at
    ``hashes[block_offsets[r]:block_offsets[r + 1]]`` in chain order.

    Raises:
        ValueError: :func:`~kvbench.workloads.formats.hash_id_keys.key_refusal` refuses ``block_size``.
    """
    refusal = key_refusal(block_size, block_tokens)
    if refusal is not None:
        raise ValueError(refusal)
    nodes = mixed_nodes(ids, offsets)
    if block_size >= block_tokens:
        serials, block_offsets = chain_block_keys(nodes, offsets, num_tokens, block_size, block_tokens)
        return splitmix64(serials), block_offsets
    per_id = block_tokens // block_size  # sub-block j % per_id of its id's node, mixed again
    num_blocks = num_tokens // block_size
    block_offsets = np.concatenate([[0], np.cumsum(num_blocks)]).astype(np.int64)
    within = np.arange(int(block_offsets[-1]), dtype=np.int64) - np.repeat(block_offsets[:-1], num_blocks)
    node = nodes[np.repeat(offsets[:-1], num_blocks) + within // per_id]
    return splitmix64(splitmix64(node ^ (within % per_id).astype(np.uint64))), block_offsets
