"""A Mooncake / hash-id trace as columns, read by pyarrow's JSON reader: the fast path of the exact
curve on traces of real size (3.2 s to read a 278 MB trace's JSON line by line, and
4.2 GB to hold it as Python objects).

:func:`hash_id_columns` streams the file in blocks (:data:`BLOCK_BYTES`) into numpy arrays (ids as
int32 where they fit) and checks every field as :func:`.mooncake.checked_record` does, vectorized.
It vouches only for what it checked: any file it cannot read this way, or any record those checks
would refuse, gives ``None``, and the caller reads the file with the line reader
(:func:`.hash_id_keys.keyed_lines`), which accepts the same files and names the bad line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from kvbench.workloads.formats.hash_ids import HashIdFormat

BLOCK_BYTES = 4 << 20  # JSON bytes per parsed block; a longer line is left to the line reader
_SCHEMA = pa.schema(
    [
        ("timestamp", pa.float64()),
        ("input_length", pa.float64()),
        ("output_length", pa.float64()),
        ("hash_ids", pa.list_(pa.int64())),
    ]
)


@dataclass(frozen=True, eq=False)
class HashIdColumns:
    """The valid lines of a trace, in file order.

    Attributes:
        timestamps_ms: float64, shape (num_requests,): ``timestamp`` in ms.
        input_lengths: int64, shape (num_requests,): prompt tokens.
        hash_ids: int32 (int64 when an id does not fit), shape (num_ids,): every line's ids, flat.
        offsets: int64, shape (num_requests + 1,): line ``r``'s ids are ``hash_ids[offsets[r]:offsets[r +
        1]]``.
    """

    timestamps_ms: np.ndarray
    input_lengths: np.ndarray
    hash_ids: np.ndarray
    offsets: np.ndarray

    @property
    def num_requests(self) -> int:
        return self.input_lengths.size


def hash_id_columns(
    path: str | Path, time_format: HashIdFormat, limit: int | None = None
) -> HashIdColumns | None:
    """The first ``limit`` (all: ``None``) lines of ``path`` as columns, or ``None`` when the line
    reader must decide (a line pyarrow cannot parse into the four fields, a missing or null field,
    a negative number, a non-integer id, an id count that is not ``ceil(input_length / block_tokens)``,
    no line at all). Memory: the columns plus one parsed block."""
    options = pa_json.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore")
    parts: list[tuple[np.ndarray, ...]] = []
    num_rows = 0
    try:
        with pa_json.open_json(
            path, read_options=pa_json.ReadOptions(block_size=BLOCK_BYTES), parse_options=options
        ) as reader:
            for batch in reader:
                part = _checked(batch, time_format.block_tokens)
                if part is None:
                    return None
                parts.append(part)
                num_rows += batch.num_rows
                if limit is not None and num_rows >= limit:
                    break
    except (pa.ArrowException, OSError, ValueError):
        return None
    if num_rows == 0:
        return None
    columns = _joined(parts, time_format, limit)
    pa.default_memory_pool().release_unused()  # the parsed blocks' buffers, back to the system
    return columns


def hash_id_column_chunks(
    path: str | Path, time_format: HashIdFormat, min_ids: int, limit: int | None = None
) -> Iterator[HashIdColumns | None]:
    """The first ``limit`` (all: ``None``) lines of ``path`` as consecutive chunks of columns, each
    holding at least ``min_ids`` ids (the last: what is left), in file order; a ``None`` (and
    nothing after it) where :func:`hash_id_columns` would give ``None``, found at the chunk it is
    in. Memory: one chunk plus one parsed block."""
    options = pa_json.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="ignore")
    parts: list[tuple[np.ndarray, ...]] = []
    num_rows = num_ids = num_yielded = 0
    try:
        with pa_json.open_json(
            path, read_options=pa_json.ReadOptions(block_size=BLOCK_BYTES), parse_options=options
        ) as reader:
            for batch in reader:
                part = _checked(batch, time_format.block_tokens)
                if part is None:
                    yield None
                    return
                parts.append(part)
                num_rows, num_ids = num_rows + batch.num_rows, num_ids + part[3].size
                done = limit is not None and num_rows >= limit
                if num_ids >= min_ids or done:
                    chunk = _joined(parts, time_format, None if limit is None else limit - num_yielded)
                    num_yielded, num_ids = num_yielded + chunk.num_requests, 0
                    yield chunk
                if done:
                    return
    except (pa.ArrowException, OSError, ValueError):
        yield None
        return
    if parts:
        yield _joined(parts, time_format, None if limit is None else limit - num_yielded)
    elif num_rows == 0:
        yield None


def _checked(batch: pa.RecordBatch, block_tokens: int) -> tuple[np.ndarray, ...] | None:
    """``(timestamps, input lengths, output lengths, ids, id counts)`` of a parsed block when every
    record passes :func:`.mooncake.checked_record`'s checks, else ``None``."""
    columns = [batch.column(name) for name in _SCHEMA.names]
    ids = columns[3]
    if any(column.null_count for column in columns) or ids.values.null_count:
        return None
    numbers = [column.to_numpy(zero_copy_only=False) for column in columns[:3]]
    values = ids.flatten().to_numpy()
    counts = np.diff(ids.offsets.to_numpy())
    if any(np.any(column < 0) for column in numbers) or np.any(values < 0):
        return None
    if not np.array_equal(counts, np.ceil(numbers[1] / block_tokens)):
        return None
    narrow = values.astype(np.int32) if values.size == 0 or values.max() < 2**31 else values
    return numbers[0], numbers[1], numbers[2], narrow, counts


def _joined(
    parts: list[tuple[np.ndarray, ...]], time_format: HashIdFormat, limit: int | None
) -> HashIdColumns:
    stamps, lengths, counts = (np.concatenate([part[i] for part in parts]) for i in (0, 1, 4))
    wide = any(part[3].dtype == np.int64 for part in parts)
    ids = np.concatenate([part[3].astype(np.int64) if wide else part[3] for part in parts])
    parts.clear()
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if limit is not None and counts.size > limit:
        stamps, lengths, offsets = stamps[:limit], lengths[:limit], offsets[: limit + 1]
        ids = ids[: int(offsets[-1])].copy()
    return HashIdColumns(stamps * time_format.ms_per_timestamp, lengths.astype(np.int64), ids, offsets)
