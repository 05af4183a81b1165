"""Read a trace's arrivals and lengths for ``kvbench memory waste``: kvbench, Mooncake, or bare lengths.

The first line decides the form:

* a kvbench trace header (``kvbench_trace``): the whole file goes through the project's trace
  reader (:func:`kvbench.workloads.trace.read_trace`, which validates every line, the header's
  request count and content hash). The real output length is ``output_tokens`` where the trace
  has it, else ``max_tokens`` (in chat and agent traces that is exactly the reply the next turn
  carries).
* Mooncake lines (kvcache-ai/Mooncake ``FAST25-release/traces``): ``timestamp`` (ms),
  ``input_length``, ``output_length`` (the real output) and ``hash_ids`` (ignored here). They carry
  no ``max_tokens``: ``default_max_tokens`` supplies one (and cuts longer outputs to it, as a server
  would); otherwise it stays unknown.
* bare length lines, for hand-written traces: ``arrival_ms`` (number >= 0),
  ``expected_prompt_tokens`` and ``max_tokens`` (integers >= 1), optional ``id`` and optional
  ``output_tokens`` (1..max_tokens, the real output; ``max_tokens`` when absent).

Every line of a Mooncake or bare-length file must have its form's fields; a bad one raises
``InputError`` naming the file, the line and the field.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvbench.memory.waste import WasteRequest
from kvbench.errors import InputError
from kvbench.workloads.trace import is_trace_header, read_trace


def read_waste_trace(path: str | Path, default_max_tokens: int | None = None,
                     limit: int | None = None) -> list[WasteRequest]:
    """Requests of a kvbench, Mooncake or bare-length trace, in file order (at most ``limit``).

    Raises:
        InputError: missing or unreadable file, a line that is not a JSON object, a missing or bad
            field (the message names file, line number and field), or no requests at all.
    """
    path = Path(path)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read trace ({exc.strerror})") from None
    with handle:
        lines = ((number, line) for number, line in enumerate(handle, start=1) if line.strip())
        first = next(lines, None)
        if first is not None and is_trace_header(_json_object(path, *first)):
            requests = _kvbench_trace_requests(path, limit)
        else:
            requests = _length_requests(path, itertools.chain([first] if first else [], lines),
                                        default_max_tokens, limit)
    if not requests:
        raise InputError(f"{path}: no requests in the trace")
    return requests


def _kvbench_trace_requests(path: Path, limit: int | None) -> list[WasteRequest]:
    trace = read_trace(path, limit)
    return [WasteRequest(request.id, request.arrival_ms, request.expected_prompt_tokens,
                         request.output_tokens or request.max_tokens, request.max_tokens)
            for request in trace.requests]


def _length_requests(path: Path, lines: Iterable[tuple[int, str]], default_max_tokens: int | None,
                     limit: int | None) -> list[WasteRequest]:
    requests: list[WasteRequest] = []
    parse = None
    for line_number, line in lines:
        record = _json_object(path, line_number, line)
        if parse is None:
            parse = _mooncake_request if "input_length" in record else _length_request
        requests.append(parse(record, _Where(path, line_number), default_max_tokens))
        if limit is not None and len(requests) >= limit:
            break
    return requests


class _Where:
    """File and line of the record being read, for error messages."""

    def __init__(self, path: Path, line_number: int) -> None:
        self.path, self.line_number = path, line_number

    def error(self, field: str | None, problem: str) -> InputError:
        return InputError.at(self.path, self.line_number, field, problem)


def _json_object(path: Path, line_number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError.at(path, line_number, None, f"not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise InputError.at(path, line_number, None, "expected a JSON object")
    return record


def _number(record: dict[str, Any], field: str, where: _Where) -> float:
    if field not in record:
        raise where.error(field, "missing")
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise where.error(field, f"expected a number >= 0, got {value!r}")
    return float(value)


def _count(record: dict[str, Any], field: str, where: _Where) -> int:
    if field not in record:
        raise where.error(field, "missing")
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise where.error(field, f"expected an integer >= 1, got {value!r}")
    return value


def _length_request(record: dict[str, Any], where: _Where, default_max_tokens: int | None) -> WasteRequest:
    arrival_ms = _number(record, "arrival_ms", where)
    prompt_tokens = _count(record, "expected_prompt_tokens", where)
    max_tokens = _count(record, "max_tokens", where)
    output_tokens = _count(record, "output_tokens", where) if "output_tokens" in record else max_tokens
    if output_tokens > max_tokens:
        raise where.error("output_tokens", f"{output_tokens} is more than max_tokens {max_tokens}")
    request_id = record.get("id", f"line-{where.line_number}")
    return WasteRequest(str(request_id), arrival_ms, prompt_tokens, output_tokens, max_tokens)


def _mooncake_request(record: dict[str, Any], where: _Where, default_max_tokens: int | None) -> WasteRequest:
    arrival_ms = _number(record, "timestamp", where)
    prompt_tokens = _count(record, "input_length", where)
    output_tokens = _count(record, "output_length", where)
    if default_max_tokens is not None:
        output_tokens = min(output_tokens, default_max_tokens)
    return WasteRequest(f"line-{where.line_number}", arrival_ms, prompt_tokens, output_tokens,
                        default_max_tokens)
