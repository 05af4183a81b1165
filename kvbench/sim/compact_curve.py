"""The exact one-pass curve of a Mooncake / hash-id trace held as numpy arrays.

:func:`compact_hit_curve` reads the file as columns (:mod:`kvbench.workloads.formats.hash_id_columns`),
turns the ids into integer block keys with the same equalities as
:class:`~kvbench.workloads.formats.hash_id_keys.ChainKeys` (:func:`chain_block_keys`), and runs the
vectorized pass (:mod:`kvbench.sim.compact_distances`): the same :class:`~kvbench.sim.curve.HitCurve`
as ``hit_curve(hash_id_trace(...))``, every request's cached tokens included
(``tests/sim/test_compact_curve.py``), with no Python object per block or request.

Ids as keys: two prompts share block ``i`` iff their first ids up to it are equal. When every id
of the trace always follows the same id (or always starts a prompt), as Mooncake's prefix-chained
ids do, equal ids already mean equal prefixes, and a key is the id itself. A trace whose ids
do not keep that promise gives ``None`` here, and the caller interns id prefixes with
``ChainKeys`` as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench.sim.compact_distances import compact_distances
from kvbench.sim.curve import HitCurve
from kvbench.sim.stack_distance import StackDistances
from kvbench.workloads.formats.hash_id_columns import HashIdColumns, hash_id_columns
from kvbench.workloads.formats.hash_id_keys import key_refusal
from kvbench.workloads.formats.hash_ids import HASH_ID_FORMATS


@dataclass(frozen=True)
class TraceSize:
    """What :class:`~kvbench.sim.curve.HitCurve` reads of its trace when no prompt is held."""

    num_requests: int
    num_prompt_tokens: int
    block_size: int


def ids_name_prefixes(hash_ids: np.ndarray, offsets: np.ndarray) -> bool:
    """Whether every id has one parent (the id before it in its prompt, or none): then equal ids
    mean equal id prefixes, and the ids themselves are chain keys."""
    parents = np.empty(hash_ids.size, dtype=hash_ids.dtype)
    parents[1:] = hash_ids[:-1]
    parents[offsets[:-1][offsets[:-1] < hash_ids.size]] = -1
    order = np.argsort(hash_ids, kind="stable").astype(np.int32 if hash_ids.size < 2**31 else np.int64)
    same = hash_ids[order[1:]] == hash_ids[order[:-1]]
    parents = parents[order]
    del order
    return not np.any(same & (parents[1:] != parents[:-1]))


def _within(counts: np.ndarray) -> np.ndarray:
    """0 .. counts[r] - 1 for each r, flat; int64."""
    starts = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)


def chain_block_keys(
    nodes: np.ndarray, offsets: np.ndarray, num_tokens: np.ndarray, block_size: int, block_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, block offsets)`` of every full ``block_size``-token block, as
    :meth:`~kvbench.workloads.formats.hash_id_keys.ChainKeys.serials` maps ids to blocks (a multiple
    of the ids' block: the node of its last id; a divisor: a sub-block of its id's node).

    Raises:
        ValueError: :func:`~kvbench.workloads.formats.hash_id_keys.key_refusal` refuses ``block_size``.
    """
    refusal = key_refusal(block_size, block_tokens)
    if refusal is not None:
        raise ValueError(refusal)
    num_blocks = num_tokens // block_size
    block_offsets = np.concatenate([[0], np.cumsum(num_blocks)])
    if block_size == block_tokens:  # drop each prompt's partial last id
        keep = np.ones(nodes.size, dtype=bool)
        partial = np.flatnonzero(np.diff(offsets) > num_blocks)
        keep[offsets[partial + 1] - 1] = False
        return nodes[keep], block_offsets
    within = _within(num_blocks)
    first_ids = np.repeat(offsets[:-1], num_blocks)
    if block_size > block_tokens:
        per_block = block_size // block_tokens
        return nodes[first_ids + (within + 1) * per_block - 1], block_offsets
    per_id = block_tokens // block_size
    if nodes.dtype == np.int64:  # wide ids: ranks first, so that id * per_id fits
        nodes = np.unique(nodes, return_inverse=True)[1].astype(np.int64)
    return nodes[first_ids + within // per_id].astype(np.int64) * per_id + within % per_id, block_offsets


def _in_arrival_order(
    keys: np.ndarray, offsets: np.ndarray, num_tokens: np.ndarray, arrivals: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests stably sorted by arrival, as :func:`~kvbench.sim.replay.in_arrival_order` sorts them."""
    if arrivals.size < 2 or not np.any(np.diff(arrivals) < 0):
        return keys, offsets, num_tokens
    order = np.argsort(arrivals, kind="stable")
    counts = np.diff(offsets)[order]
    keys = keys[np.repeat(offsets[:-1][order], counts) + _within(counts)]
    return keys, np.concatenate([[0], np.cumsum(counts)]), num_tokens[order]


def compact_hit_curve(
    path: str | Path, format_name: str, block_size: int, limit: int | None = None
) -> HitCurve | None:
    """The exact tail-first curve of the first ``limit`` lines of a Mooncake / hash-id trace, or
    ``None`` when :func:`hash_id_columns` or :func:`ids_name_prefixes` leaves the trace to the line reader.

    Raises:
        ValueError: ``block_size`` refused by :func:`~kvbench.workloads.formats.hash_id_keys.key_refusal`.
    """
    time_format = HASH_ID_FORMATS[format_name]
    held = [hash_id_columns(path, time_format, limit)]  # no other reference: freed once they are keys
    return None if held[0] is None else columns_hit_curve(held, block_size, time_format.block_tokens)


def columns_hit_curve(held: list[HashIdColumns], block_size: int, block_tokens: int) -> HitCurve | None:
    """:func:`compact_hit_curve` from columns already read, taken out of ``held`` (so that the ids
    are freed once they are keys)."""
    columns = held.pop()
    if not ids_name_prefixes(columns.hash_ids, columns.offsets):
        return None
    nodes, stamps_ms, num_tokens, id_offsets = (
        columns.hash_ids,
        columns.timestamps_ms,
        columns.input_lengths,
        columns.offsets,
    )
    del columns
    keys, offsets = chain_block_keys(nodes, id_offsets, num_tokens, block_size, block_tokens)
    del nodes
    keys, offsets, num_tokens = _in_arrival_order(keys, offsets, num_tokens, stamps_ms)
    distances, num_distinct = compact_distances(keys, offsets)
    del keys
    caps = np.maximum(num_tokens - 1, 0) // block_size  # kvbench.cache.block_hash.max_hit_blocks
    size = TraceSize(int(num_tokens.size), int(num_tokens.sum()), block_size)
    return HitCurve(size, StackDistances(distances, offsets, caps, num_distinct))
