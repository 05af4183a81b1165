"""Validating reader for kvbench trace files (format: :mod:`.kvbench_trace`), and the one conversion
of a trace into :class:`kvbench.request.Request` objects (:func:`trace_requests`).

Every problem is an ``InputError`` of one line, ``FILE:LINE: field 'F': problem`` (CLI exit 2).
Identical messages are shared between requests (histories repeat), which keeps chat traces small
in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvbench.errors import InputError
from kvbench.request import MESSAGE_ROLES, Message, Request
from kvbench.workloads.formats.jsonl import JsonlFile, json_object, open_jsonl
from kvbench.workloads.formats.kvbench_trace import (
    HEADER_FIELDS,
    REQUEST_FIELDS,
    TRACE_FORMAT_VERSION,
    ContentHash,
    Trace,
    TraceHeader,
    TraceRequest,
)
from kvbench.workloads.tokenizer import Tokenizer, render_all

if TYPE_CHECKING:
    from kvbench.workloads.formats.trace_columns import TraceColumns


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


class TraceReader:
    """Reads one trace file; ``read(limit)`` returns a :class:`Trace`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._messages: dict[tuple[str, str], Message] = {}

    def _error(self, line: int, field: str | None, problem: str) -> InputError:
        return InputError.at(self.path, line, field, problem)

    def header(self, line_number: int, record: dict) -> TraceHeader:
        """Validate the header line."""
        for key in record:
            if key not in HEADER_FIELDS:
                raise self._error(
                    line_number, key, f"unknown header field (known: {', '.join(HEADER_FIELDS)})"
                )
        if record.get("kvbench_trace") != TRACE_FORMAT_VERSION:
            raise self._error(
                line_number,
                "kvbench_trace",
                f"unsupported format version {record.get('kvbench_trace')!r} (expected 1)",
            )
        checks = {
            "kvbench_version": str,
            "generator": str,
            "params": dict,
            "tokenizer": str,
            "chat_format": str,
        }
        for key, kind in checks.items():
            if not isinstance(record.get(key), kind):
                raise self._error(line_number, key, f"expected a {kind.__name__}, got {record.get(key)!r}")
        if record.get("seed") is not None and not _is_int(record["seed"], 0):
            raise self._error(
                line_number, "seed", f"expected a non-negative integer or null, got {record['seed']!r}"
            )
        if not _is_int(record.get("num_requests"), 0):
            raise self._error(
                line_number,
                "num_requests",
                f"expected a non-negative integer, got {record.get('num_requests')!r}",
            )
        hash_value = record.get("content_hash")
        if hash_value is not None and not (isinstance(hash_value, str) and hash_value.startswith("sha256:")):
            raise self._error(
                line_number, "content_hash", f"expected 'sha256:<hex>' or null, got {hash_value!r}"
            )
        return TraceHeader(
            record["generator"],
            record["params"],
            record.get("seed"),
            record["tokenizer"],
            record["chat_format"],
            record["num_requests"],
            hash_value,
            record["kvbench_version"],
        )

    def _message(self, line_number: int, index: int, item: Any) -> Message:
        where = f"messages[{index}]"
        if not isinstance(item, dict) or set(item) != {"role", "content"}:
            raise self._error(line_number, where, "expected an object with exactly 'role' and 'content'")
        role, content = item["role"], item["content"]
        if role not in MESSAGE_ROLES:
            raise self._error(
                line_number, f"{where}.role", f"expected one of {', '.join(MESSAGE_ROLES)}, got {role!r}"
            )
        if not isinstance(content, str):
            raise self._error(
                line_number, f"{where}.content", f"expected a string, got {type(content).__name__}"
            )
        key = (role, content)
        message = self._messages.get(key)
        if message is None:
            message = self._messages[key] = Message(role, content)
        return message

    def payload(self, line_number: int, record: dict) -> dict[str, Any]:
        """``{"messages": (Message, ...)}`` or ``{"prompt": str}`` of a line, validated (``InputError``
        naming the file, line and field). The importers of :mod:`.prompts` use it too."""
        has_messages, has_prompt = record.get("messages") is not None, record.get("prompt") is not None
        if has_messages == has_prompt:
            raise self._error(line_number, "messages", "exactly one of 'messages' and 'prompt' is required")
        if has_prompt:
            if not isinstance(record["prompt"], str) or not record["prompt"]:
                raise self._error(line_number, "prompt", "expected a non-empty string")
            return {"prompt": record["prompt"]}
        items = record["messages"]
        if not isinstance(items, list) or not items:
            raise self._error(line_number, "messages", "expected a non-empty list of messages")
        return {"messages": tuple(self._message(line_number, i, item) for i, item in enumerate(items))}

    def request(self, line_number: int, record: dict) -> TraceRequest:
        """Validate one request line."""
        for key in record:
            if key not in REQUEST_FIELDS:
                raise self._error(line_number, key, f"unknown field (known: {', '.join(REQUEST_FIELDS)})")
        for key in ("id", "session_id"):
            if not isinstance(record.get(key), str) or not record[key]:
                raise self._error(line_number, key, f"expected a non-empty string, got {record.get(key)!r}")
        for key, minimum in (("turn", 0), ("max_tokens", 1), ("expected_prompt_tokens", 1)):
            if not _is_int(record.get(key), minimum):
                raise self._error(
                    line_number, key, f"expected an integer >= {minimum}, got {record.get(key)!r}"
                )
        arrival = record.get("arrival_ms")
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not arrival >= 0:
            raise self._error(line_number, "arrival_ms", f"expected a number >= 0, got {arrival!r}")
        salt, output = record.get("salt"), record.get("output_tokens")
        if salt is not None and not isinstance(salt, str):
            raise self._error(line_number, "salt", f"expected a string or null, got {salt!r}")
        if output is not None and not (_is_int(output, 1) and output <= record["max_tokens"]):
            raise self._error(
                line_number, "output_tokens", f"expected an integer in 1..max_tokens, got {output!r}"
            )
        return TraceRequest(
            record["id"],
            record["session_id"],
            record["turn"],
            float(arrival),
            record["max_tokens"],
            record["expected_prompt_tokens"],
            salt=salt,
            output_tokens=output,
            **self.payload(line_number, record),
        )

    def read(self, file: JsonlFile, limit: int | None = None) -> Trace:
        """Read the open file (first ``limit`` requests only, if given). Raises ``InputError``."""
        if file.first_number is None:
            raise InputError(f"{self.path}: the file is empty")
        if not isinstance(file.first, dict):
            raise self._error(file.first_number, None, "expected a JSON object")
        header = self.header(file.first_number, file.first)
        columns = _columns(file, limit)
        if columns is not None:
            if limit is None or len(columns.requests) < limit:
                self._check_totals(header, columns.requests, columns.content_hash)
            return Trace(header, columns.requests)
        requests: list[TraceRequest] = []
        digest = ContentHash()  # of the lines as read, not the lines kept: memory of one line
        ids: set[str] = set()
        for line_number, line in file.rest:
            record = json_object(self.path, line_number, line)
            requests.append(self._checked(line_number, self.request(line_number, record), requests, ids))
            digest.add(line)
            if limit is not None and len(requests) >= limit:
                break
        if limit is None or len(requests) < limit:
            self._check_totals(header, requests, digest.value)
        return Trace(header, tuple(requests))

    def _checked(
        self, line_number: int, request: TraceRequest, earlier: list[TraceRequest], ids: set[str]
    ) -> TraceRequest:
        """Check arrival order and id uniqueness against the lines before."""
        if request.id in ids:
            raise self._error(line_number, "id", f"duplicate id {request.id!r}")
        ids.add(request.id)
        if earlier and request.arrival_ms < earlier[-1].arrival_ms:
            raise self._error(
                line_number,
                "arrival_ms",
                f"{request.arrival_ms} is before the previous line's {earlier[-1].arrival_ms} "
                "(requests must be in arrival order)",
            )
        return request

    def _check_totals(self, header: TraceHeader, requests: Sequence[TraceRequest], lines_hash: str) -> None:
        if header.num_requests != len(requests):
            raise InputError.at(
                self.path,
                1,
                "num_requests",
                f"the header says {header.num_requests}, the file has {len(requests)} requests",
            )
        if header.content_hash is not None and lines_hash != header.content_hash:
            raise InputError.at(
                self.path,
                1,
                "content_hash",
                "does not match the request lines (edited after generation? set it to null to accept edits)",
            )


def _columns(file: JsonlFile, limit: int | None) -> TraceColumns | None:
    """The request lines as columns (:func:`.trace_columns.trace_columns`) when the header is line 1
    of a seekable file and the columns vouch for every line; else ``None``, the file back where it was.
    Imported here: pyarrow's JSON reader costs ~0.4 s to import, which ``trace import`` never needs."""
    from kvbench.workloads.formats.trace_columns import trace_columns

    handle = file.handle
    if file.first_number != 1 or handle is None or not handle.seekable():
        return None
    start = handle.tell()
    columns = trace_columns(handle, limit)
    if columns is None:
        handle.seek(start)
    return columns


def read_trace_file(path: Path, limit: int | None = None) -> Trace:
    """Open ``path`` and read it as a kvbench trace (see :meth:`TraceReader.read`)."""
    with open_jsonl(path) as file:
        return TraceReader(path).read(file, limit)


def trace_requests(
    trace: Trace | Sequence[TraceRequest], tokenizer: Tokenizer, check: bool = True
) -> list[Request]:
    """Render every trace request with ``tokenizer`` into a :class:`Request`, in trace order.

    Each keeps its id, session, turn, arrival (ms -> s), budget, salt and text form (``messages`` or
    ``prompt``). ``output_tokens`` is the trace's ``output_tokens`` when it records one, else
    ``max_tokens`` (the format's rule: a request is taken to generate its budget).

    Raises:
        ValueError: with ``check``, a request renders to a count other than its
            ``expected_prompt_tokens`` (the trace was counted with another tokenizer, or edited).
    """
    requests = trace.requests if isinstance(trace, Trace) else trace
    converted = []
    for index, (request, token_ids) in enumerate(zip(requests, render_all(tokenizer, requests))):
        if check and token_ids.shape[0] != request.expected_prompt_tokens:
            raise ValueError(
                f"request {request.id}: renders to {token_ids.shape[0]} tokens with "
                f"{tokenizer.name}, expected_prompt_tokens says {request.expected_prompt_tokens}"
            )
        converted.append(
            Request(
                index,
                request.id,
                request.session_id,
                request.turn,
                token_ids.astype(np.uint32, copy=False),
                arrival_s=request.arrival_ms / 1000.0,
                max_tokens=request.max_tokens,
                salt=request.salt,
                output_tokens=request.output_tokens or request.max_tokens,
                messages=request.messages,
                prompt=request.prompt,
            )
        )
    return converted
