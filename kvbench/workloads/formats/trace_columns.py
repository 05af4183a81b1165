"""A kvbench trace's request lines read as columns: pyarrow's JSON reader over
blocks of whole lines, with :class:`~.kvbench_trace_reader.TraceReader`'s checks done on arrays.

The line reader costs ~15 us a line in Python (``json.loads``, a dozen field checks, the arrival
order, the id set, the content hash); a million tiny prompts spend most of ``trace stats``, ``sim``
and ``bill`` there. :func:`trace_columns` reads the same file a block of lines at a time
(:data:`BLOCK_BYTES`): the bytes scanned with numpy (a line starts with ``{``, holds no ``\\r``, is
UTF-8 and no longer than :func:`.lines.max_line_bytes`), fed to the content hash as they are, and
parsed into typed columns by pyarrow (an unknown field, a wrong JSON type, a number out of range or
two objects on one line all fail the parse). It vouches only for what it checked, as
:mod:`.hash_id_columns` does: any line the line reader could refuse gives ``None``, and the caller
reads the file with the line reader, whose error line is then the answer. So a file gives exactly
the :class:`~.kvbench_trace.Trace` and the error lines it gave before
(``tests/workloads/test_trace_columns.py`` compares both paths on good and bad files).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from kvbench.request import MESSAGE_ROLES, Message
from kvbench.workloads.formats.kvbench_trace import ContentHash, TraceRequest
from kvbench.workloads.formats.lines import max_line_bytes

BLOCK_BYTES = 4 << 20  # bytes of whole lines parsed at a time: ~40k tiny request lines
_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
# the fields of kvbench_trace.REQUEST_FIELDS
_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("session_id", pa.string()),
        ("turn", pa.int64()),
        ("arrival_ms", pa.float64()),
        ("messages", pa.list_(_MESSAGE)),
        ("prompt", pa.string()),
        ("max_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("salt", pa.string()),
        ("expected_prompt_tokens", pa.int64()),
    ]
)
_OPTIONS = pa_json.ParseOptions(explicit_schema=_SCHEMA, unexpected_field_behavior="error")
_ROLES = pa.array(MESSAGE_ROLES)
_FIELD_ORDER = tuple(field.name for field in dataclasses.fields(TraceRequest))  # of_checked's order


@dataclass(frozen=True, eq=False)
class TraceColumns:
    """The request lines the columns vouch for, in file order.

    Attributes:
        requests: one :class:`TraceRequest` per line (messages shared between equal ones).
        content_hash: ``sha256:<hex>`` of the lines read (:class:`~.kvbench_trace.ContentHash`).
    """

    requests: tuple[TraceRequest, ...]
    content_hash: str


def _blocks(handle, limit_bytes: int) -> Iterator[bytes]:
    """Whole lines (each ending in ``\\n``) about :data:`BLOCK_BYTES` at a time; the last line gets a
    ``\\n`` if the file has none. Stops (yields ``b""``) at a line longer than ``limit_bytes``."""
    rest = b""
    while chunk := handle.read(BLOCK_BYTES):
        rest += chunk
        cut = rest.rfind(b"\n") + 1
        if cut == 0:
            if len(rest) > limit_bytes + 1:
                yield b""
                return
            continue
        yield rest[:cut]
        rest = rest[cut:]
    if rest:
        yield rest + b"\n"


def _plain_lines(block: bytes, limit_bytes: int) -> int | None:
    """The number of lines in ``block`` when each starts with ``{``, has no ``\\r``, is at most
    ``limit_bytes`` long and the block is UTF-8; else ``None`` (the line reader decides)."""
    if b"\r" in block:
        return None
    raw = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(raw == 0x0A)
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    if np.any(raw[starts] != 0x7B) or int((ends - starts).max()) > limit_bytes:
        return None
    if not block.isascii():
        try:
            block.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return ends.size


def _holds(condition: pa.ChunkedArray | pa.Array) -> bool:
    """Whether a boolean array is true wherever it is not null."""
    return condition.null_count == len(condition) or pc.all(condition).as_py()


def _valid(table: pa.Table) -> bool:
    """Whether every row passes :meth:`TraceReader.request`'s checks."""
    required = ("id", "session_id", "turn", "arrival_ms", "max_tokens", "expected_prompt_tokens")
    if any(table.column(name).null_count for name in required):
        return False
    if not all(
        _holds(pc.greater(pc.binary_length(table.column(name)), 0)) for name in ("id", "session_id", "prompt")
    ):
        return False
    turn, arrival_ms, max_tokens, expected = (
        table.column(name).to_numpy()
        for name in ("turn", "arrival_ms", "max_tokens", "expected_prompt_tokens")
    )
    # NaN fails
    if np.any(turn < 0) or not np.all(arrival_ms >= 0) or np.any(max_tokens < 1) or np.any(expected < 1):
        return False
    output = table.column("output_tokens")
    if not (
        _holds(pc.greater_equal(output, 1)) and _holds(pc.less_equal(output, table.column("max_tokens")))
    ):
        return False
    prompt, messages = table.column("prompt"), table.column("messages")
    if not _holds(pc.xor(pc.is_valid(prompt), pc.is_valid(messages))):
        return False
    return messages.null_count == len(messages) or _valid_messages(messages)


def _valid_messages(messages: pa.ChunkedArray) -> bool:
    """Non-empty lists of non-null messages, each with a known role and a content string."""
    if not _holds(pc.greater(pc.list_value_length(messages), 0)):
        return False
    items = pc.list_flatten(messages)
    if items.null_count:
        return False
    roles, contents = pc.struct_field(items, "role"), pc.struct_field(items, "content")
    return not roles.null_count and not contents.null_count and _holds(pc.is_in(roles, value_set=_ROLES))


def _requests(table: pa.Table, shared: dict[tuple[str, str], Message]) -> list[TraceRequest]:
    """The rows as :class:`TraceRequest` objects; ``shared`` interns equal messages across blocks."""
    names = [name for name in _FIELD_ORDER if name != "messages"]
    columns = dict(zip(names, (table.column(name).to_pylist() for name in names)))
    messages = table.column("messages")
    if messages.null_count == table.num_rows:
        columns["messages"] = itertools.repeat(None, table.num_rows)
    else:
        columns["messages"] = [
            None
            if items is None
            else tuple(
                shared.setdefault((m["role"], m["content"]), Message(m["role"], m["content"])) for m in items
            )
            for items in messages.to_pylist()
        ]
    return [TraceRequest.of_checked(row) for row in zip(*(columns[name] for name in _FIELD_ORDER))]


def trace_columns(handle: BinaryIO, limit: int | None = None) -> TraceColumns | None:
    """The request lines of a kvbench trace open as ``handle`` (bytes, just past its header line),
    the first ``limit`` of them (all: ``None``), or ``None`` when the line reader must decide: a line
    that is blank, starts with other than ``{``, holds ``\\r``, is not UTF-8 or longer than the
    bound; a line pyarrow cannot parse into the request fields (unknown field, wrong JSON type, an
    integer that is not one, two values on a line); a row the reader's checks would refuse; ids not
    unique or arrivals out of order. Memory: the requests plus one block. The caller puts the
    handle back where it was before it reads the lines again.

    Raises:
        OSError: the file cannot be read (the caller has opened it already).
    """
    limit_bytes = max_line_bytes()
    requests: list[TraceRequest] = []
    digest, shared, last_arrival_ms = ContentHash(), {}, -np.inf
    for block in _blocks(handle, limit_bytes):
        num_lines = _plain_lines(block, limit_bytes) if block else None
        if num_lines is None:
            return None
        try:
            # one parse of the whole block: a line may be long
            table = pa_json.read_json(
                pa.BufferReader(block),
                parse_options=_OPTIONS,
                read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block) + 1),
            )
        except pa.ArrowException:
            return None
        if table.num_rows != num_lines:
            return None
        wanted = num_lines if limit is None else min(num_lines, limit - len(requests))
        table = table.slice(0, wanted)
        arrivals = table.column("arrival_ms").to_numpy()
        if not _valid(table) or (
            arrivals.size and (arrivals[0] < last_arrival_ms or np.any(np.diff(arrivals) < 0))
        ):
            return None
        if arrivals.size:
            last_arrival_ms = arrivals[-1]
        _add_lines(digest, block, wanted, num_lines)
        requests.extend(_requests(table, shared))
        del table
        pa.default_memory_pool().release_unused()  # the parsed block's buffers, back to the system
        if limit is not None and len(requests) >= limit:
            break
    if len({request.id for request in requests}) != len(requests):
        return None
    return TraceColumns(tuple(requests), digest.value)


def _add_lines(digest: ContentHash, block: bytes, wanted: int, num_lines: int) -> None:
    """Feed the first ``wanted`` of ``block``'s ``num_lines`` lines to the content hash."""
    if wanted == num_lines:
        digest.add_bytes(block[:-1])
        return
    cut = -1
    for _ in range(wanted):
        cut = block.index(b"\n", cut + 1)
    if wanted:
        digest.add_bytes(block[:cut])
