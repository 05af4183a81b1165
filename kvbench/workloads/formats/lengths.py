"""Lengths-only JSONL: arrivals and token counts, no text and no token ids (``kvbench memory waste``).

Two line forms; the first line decides which one the whole file uses:

* bare length lines, for hand-written traces: ``arrival_ms`` (number >= 0),
  ``expected_prompt_tokens`` and ``max_tokens`` (integers >= 1), optional ``id`` and optional
  ``output_tokens`` (1..max_tokens, the real output; ``max_tokens`` when absent).
* Mooncake lines read for their lengths only: ``timestamp`` (ms), ``input_length``,
  ``output_length`` (the real output); ``hash_ids`` is not needed. They carry no ``max_tokens``:
  ``default_max_tokens`` supplies one (and cuts longer outputs to it, as a server would);
  otherwise it stays unknown (``None``).

Every line must have its form's fields; a bad one raises ``InputError`` naming the file, the line
and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvbench.errors import InputError
from kvbench.workloads.formats.jsonl import JsonlFile, json_object


@dataclass(frozen=True)
class LengthRecord:
    """One line's lengths: id (the line's ``id`` or ``line-N``), arrival (ms), prompt and real
    output tokens, and the output budget (``None`` when the file does not say)."""

    request_id: str
    arrival_ms: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None


def _number(record: dict[str, Any], field: str, file: JsonlFile, line: int) -> float:
    if field not in record:
        raise file.error(line, field, "missing")
    value = record[field]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise file.error(line, field, f"expected a number >= 0, got {value!r}")
    return float(value)


def _count(record: dict[str, Any], field: str, file: JsonlFile, line: int) -> int:
    if field not in record:
        raise file.error(line, field, "missing")
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise file.error(line, field, f"expected an integer >= 1, got {value!r}")
    return value


def _bare(record: dict[str, Any], file: JsonlFile, line: int, default_max_tokens: int | None) -> LengthRecord:
    arrival_ms = _number(record, "arrival_ms", file, line)
    prompt_tokens = _count(record, "expected_prompt_tokens", file, line)
    max_tokens = _count(record, "max_tokens", file, line)
    output_tokens = _count(record, "output_tokens", file, line) if "output_tokens" in record else max_tokens
    if output_tokens > max_tokens:
        raise file.error(line, "output_tokens", f"{output_tokens} is more than max_tokens {max_tokens}")
    return LengthRecord(
        str(record.get("id", f"line-{line}")), arrival_ms, prompt_tokens, output_tokens, max_tokens
    )


def _mooncake(
    record: dict[str, Any], file: JsonlFile, line: int, default_max_tokens: int | None
) -> LengthRecord:
    arrival_ms = _number(record, "timestamp", file, line)
    prompt_tokens = _count(record, "input_length", file, line)
    output_tokens = _count(record, "output_length", file, line)
    if default_max_tokens is not None:
        output_tokens = min(output_tokens, default_max_tokens)
    return LengthRecord(f"line-{line}", arrival_ms, prompt_tokens, output_tokens, default_max_tokens)


def read_lengths(
    file: JsonlFile, default_max_tokens: int | None = None, limit: int | None = None
) -> list[LengthRecord]:
    """The lines of an open lengths-only file (at most ``limit``), in file order.

    Raises:
        InputError: a line that is not a JSON object, a missing or bad field (file, line, field),
            or no line at all.
    """
    records: list[LengthRecord] = []
    parse = None
    for line_number, line in file.lines():
        record = json_object(file.path, line_number, line)
        if parse is None:
            parse = _mooncake if "input_length" in record else _bare
        records.append(parse(record, file, line_number, default_max_tokens))
        if limit is not None and len(records) >= limit:
            break
    if not records:
        raise InputError(f"{file.path}: no requests in the trace")
    return records
