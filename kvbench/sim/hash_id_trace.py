"""``kvbench sim``'s reader for Mooncake and hash-id traces: block keys from the ids, streaming.

:func:`hash_id_trace` reads the file line by line into a :class:`~kvbench.sim.replay.PreparedTrace`
whose keys come from the ids (:mod:`kvbench.workloads.formats.hash_id_keys`), never holding a token id
or a line: the same trace, for the hash cache, as ``prepare_prompts(load_source(path).requests, B)``
(same requests, arrivals, token counts and key equalities, so every replay, the one-pass curve and
the TTL curve give identical results; ``tests/sim/test_hash_id_trace.py`` checks it on the Mooncake
trace). On the 12,031-request Mooncake conversation trace at block 512 it replaces 4.5 s of token
synthesis and SHA-256 by ~0.3 s (``benchmarks/shards_bench.py --reading``).

Where keys from ids would differ (:func:`hash_id_refusal`) the caller reads token ids as before.
:func:`hash_id_sampled_curve` streams the same keys (mixed, not interned) into the sampled pass of
:mod:`kvbench.sim.shards`, holding only its sample.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.errors import InputError
from kvbench.sim.replay import PreparedTrace, in_arrival_order
from kvbench.sim.shards import SampledCurve, ShardsPass, key_hash
from kvbench.sim.shards_columns import sampling_hashes
from kvbench.sim.streamed_curve import CHUNK_IDS
from kvbench.workloads.formats.hash_id_columns import hash_id_column_chunks
from kvbench.workloads.formats.hash_id_keys import ChainKeys, key_refusal, keyed_lines
from kvbench.workloads.formats.hash_ids import HASH_ID_FORMATS
from kvbench.workloads.formats.jsonl import HASH_IDS, MOONCAKE, open_jsonl

HASH_ID_TRACES = (MOONCAKE, HASH_IDS)  # the formats whose lines carry block ids


def hash_id_refusal(config: CacheConfig, format_name: str) -> str | None:
    """Why ``config`` needs the token-id path for a ``format_name`` trace, or ``None``."""
    if format_name not in HASH_ID_TRACES:
        return f"a {format_name} trace carries no block ids"
    if config.kind is not CacheKind.HASH or config.verify_tokens:
        return "the radix cache and verified keys compare token ids"
    if config.hash.hash_bits is not None:
        return "truncated keys collide as truncated SHA-256 digests do, not as ids"
    return key_refusal(config.block_size, HASH_ID_FORMATS[format_name].block_tokens)


def hash_id_trace(
    path: str | Path, format_name: str, block_size: int, limit: int | None = None
) -> PreparedTrace:
    """The first ``limit`` (all: ``None``) requests of a Mooncake / hash-id trace, keys from ids.

    Arrivals as the token-id readers give them: Mooncake ``timestamp / 1000`` s; hash-id traces
    shifted so the first is at 0. Stably sorted by arrival, as :func:`~kvbench.sim.replay.prepare_prompts`.

    Raises:
        InputError: unreadable file or malformed line (file, line and field).
        ValueError: ``block_size`` refused by :func:`~kvbench.workloads.formats.hash_id_keys.key_refusal`.
    """
    time_format = HASH_ID_FORMATS[format_name]
    keys = ChainKeys(block_size, time_format.block_tokens)
    prompts, stamps_ms = [], []
    with open_jsonl(path) as file:
        for item in keyed_lines(file, time_format, keys, limit):
            prompts.append(item.prompt)
            stamps_ms.append(item.timestamp_ms)
    arrivals_ms = np.array(stamps_ms, dtype=np.float64)
    if format_name == HASH_IDS:  # hash_id_requests puts the first arrival at 0
        arrivals_ms = arrivals_ms - arrivals_ms.min()
    return in_arrival_order(prompts, arrivals_ms / 1000.0, block_size)


def hash_id_sampled_curve(
    path: str | Path, format_name: str, shards: ShardsPass, limit: int | None = None
) -> SampledCurve:
    """The sampled curve of a Mooncake / hash-id trace in bounded memory, straight into ``shards`` (its
    block size is the trace's block size here): read as columns a chunk at a time, keys mixed from
    the ids and sampled in numpy (:mod:`kvbench.sim.shards_columns`); a file the column reader does
    not vouch for, or one out of arrival order, is read again from the start by the line reader
    (same keys, one line at a time), which names the bad line.

    Raises:
        InputError: as :func:`hash_id_trace`, and a line that arrives before the line above it (the
            sampled pass takes the file's order; the exact paths sort).
    """
    time_format = HASH_ID_FORMATS[format_name]
    previous_ms = -np.inf
    for chunk in hash_id_column_chunks(path, time_format, CHUNK_IDS, limit):
        stamps = chunk.timestamps_ms if chunk is not None else None
        if stamps is None or (stamps.size and (stamps[0] < previous_ms or np.any(np.diff(stamps) < 0))):
            shards.reset()
            return _line_sampled_curve(path, format_name, shards, limit)
        previous_ms = float(stamps[-1]) if stamps.size else previous_ms
        num_tokens = chunk.input_lengths
        hashes, offsets = sampling_hashes(
            chunk.hash_ids, chunk.offsets, num_tokens, shards.block_size, time_format.block_tokens
        )
        shards.add_chunk(hashes, offsets, max_hit_blocks(num_tokens, shards.block_size), num_tokens)
    return shards.curve()


def max_hit_blocks(num_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """The last-token cap of each prompt (:func:`kvbench.cache.block_hash.max_hit_blocks`); int64."""
    return np.maximum(num_tokens.astype(np.int64) - 1, 0) // block_size


def _line_sampled_curve(
    path: str | Path, format_name: str, shards: ShardsPass, limit: int | None = None
) -> SampledCurve:
    """:func:`hash_id_sampled_curve` one line at a time (keys mixed without interning)."""
    time_format = HASH_ID_FORMATS[format_name]
    keys = ChainKeys(shards.block_size, time_format.block_tokens, interned=False)
    previous_ms = -np.inf
    with open_jsonl(path) as file:
        for item in keyed_lines(file, time_format, keys, limit):
            if item.timestamp_ms < previous_ms:
                raise InputError.at(
                    path,
                    item.line,
                    "timestamp",
                    "earlier than the line before: the sampled "
                    "curve reads the trace in file order (sort it by timestamp)",
                )
            previous_ms = item.timestamp_ms
            prompt = item.prompt
            shards.add(
                [key_hash(key) for key in prompt.block_hashes], prompt.max_hit_blocks, prompt.num_tokens
            )
    return shards.curve()
