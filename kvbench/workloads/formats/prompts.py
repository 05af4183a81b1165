"""Plain JSONL of prompts or chat messages, one request per line (``kvbench trace import jsonl``).

Each line is a JSON object with exactly one of:

* ``prompt``: a non-empty string (sent to ``/v1/completions``), or
* ``messages``: a non-empty list of ``{"role", "content"}`` (OpenAI chat format).

Optional fields: ``session_id`` (string; default: the line is its own session), ``turn`` (integer
>= 0; default: the count of earlier lines of its session), ``timestamp`` (seconds) or
``arrival_ms`` (milliseconds), both shifted so the first request arrives at 0 (default: 0),
``max_tokens`` (integer >= 1; default 64) and ``output_tokens`` (the real output, 1..max_tokens).
Any other field is ignored (files from other tools carry ids, labels, answers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench.errors import InputError
from kvbench.workloads.formats.jsonl import json_object, open_jsonl
from kvbench.workloads.formats.kvbench_trace_reader import TraceReader
from kvbench.workloads.formats.rows import BadRows, int_at_least, number_at_least
from kvbench.workloads.generators import Draft
from kvbench.workloads.token_ids import DEFAULT_MAX_TOKENS


def _arrival_ms(path: Path, line: int, record: dict[str, Any]) -> float:
    for field, scale in (("arrival_ms", 1.0), ("timestamp", 1000.0)):
        if field in record:
            if not number_at_least(record[field], 0):
                raise InputError.at(path, line, field, f"expected a number >= 0, got {record[field]!r}")
            return float(record[field]) * scale
    return 0.0


def _optional_int(path: Path, line: int, record: dict[str, Any], field: str, minimum: int) -> int | None:
    value = record.get(field)
    if value is not None and not int_at_least(value, minimum):
        raise InputError.at(path, line, field, f"expected an integer >= {minimum}, got {value!r}")
    return value


def _draft(reader: TraceReader, line: int, record: dict[str, Any], turns: dict[str, int]) -> Draft:
    path = reader.path
    payload = reader.payload(line, record)
    session = record.get("session_id", f"line-{line}")
    if not isinstance(session, str) or not session:
        raise InputError.at(path, line, "session_id", f"expected a non-empty string, got {session!r}")
    turn = _optional_int(path, line, record, "turn", 0)
    max_tokens = _optional_int(path, line, record, "max_tokens", 1) or DEFAULT_MAX_TOKENS
    output = _optional_int(path, line, record, "output_tokens", 1)
    if output is not None and output > max_tokens:
        raise InputError.at(path, line, "output_tokens", f"{output} is more than max_tokens {max_tokens}")
    turn = turns.get(session, 0) if turn is None else turn
    turns[session] = turn + 1
    return Draft(session, turn, _arrival_ms(path, line, record), max_tokens, output_tokens=output, **payload)


def read_prompt_drafts(path: Path, bad: BadRows, limit: int | None = None) -> list[Draft]:
    """The drafts of a prompts / messages JSONL file, in file order (at most ``limit``).

    Raises:
        InputError: the file is unreadable or empty, or (without ``bad.skip``) a line is malformed
            (names the file, line and field).
    """
    reader, turns, drafts = TraceReader(path), {}, []
    with open_jsonl(path) as file:
        for line, text in file.lines():
            draft = bad.guard(lambda: _draft(reader, line, json_object(path, line, text), turns))
            if draft is not None:
                drafts.append(draft)
            if limit is not None and len(drafts) >= limit:
                break
    return drafts
