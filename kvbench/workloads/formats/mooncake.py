"""Mooncake traces (kvcache-ai/Mooncake, ``FAST25-release/traces``) as token-id requests.

Each line: ``timestamp`` (ms from the trace start), ``input_length`` and ``output_length`` (tokens),
``hash_ids`` (one id per 512-token block of the prompt, prefix-chained: equal ids at equal positions
mean an equal prefix). There is no text, so each hash id becomes a fixed pseudo-random block of 512
token ids derived from the id alone (equal ids give equal tokens); the last block is cut to the
request's input length. Token ``j`` of id ``h`` is ``splitmix64(h * 512 + j) mod vocab_size``.

Other traces with hash ids name other block sizes (Qwen-Bailian and ServeGen: 16 tokens,
``../shared/REFERENCES.md`` section 5): every function here takes ``block_tokens`` (default 512),
and token ``j`` of id ``h`` is then ``splitmix64(h * block_tokens + j) mod vocab_size``.

Request ``i`` (0-based, file order) is ``r{i:06d}``, its own session, turn 0, no salt; its budget
and ``output_tokens`` are ``output_length`` (``DEFAULT_MAX_TOKENS`` when that is 0).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.workloads.formats.jsonl import JsonlFile, json_object, open_jsonl
from kvbench.workloads.token_ids import CL100K_VOCAB_SIZE, DEFAULT_MAX_TOKENS

MOONCAKE_BLOCK_TOKENS = 512  # the traces' hash_ids name 512-token blocks (FAST'25 README)
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, elementwise on uint64 (wrapping arithmetic); same shape."""
    with np.errstate(over="ignore"):
        z = values + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hash_id_tokens(
    hash_ids: list[int],
    num_tokens: int,
    vocab_size: int = CL100K_VOCAB_SIZE,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> np.ndarray:
    """Token ids for a prompt made of the ``block_tokens``-token blocks ``hash_ids``, cut to
    ``num_tokens``; uint32, shape (num_tokens,)."""
    positions = np.arange(block_tokens, dtype=np.uint64)
    ids = np.asarray(hash_ids, dtype=np.uint64)[:, None] * np.uint64(block_tokens)
    tokens = splitmix64((ids + positions).reshape(-1)[:num_tokens]) % np.uint64(vocab_size)
    return tokens.astype(np.uint32)


def checked_record(
    path: Path, line_number: int, record: dict, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> dict:
    """``record`` when it has every Mooncake field, valid, and one hash id per ``block_tokens``-token
    block of ``input_length``. Raises ``InputError`` naming the file, line and field."""
    for field in _FIELDS:
        if field not in record:
            raise InputError.at(path, line_number, field, "missing")
    for field in ("timestamp", "input_length", "output_length"):
        value = record[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise InputError.at(path, line_number, field, f"expected a non-negative number, got {value!r}")
    ids = record["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise InputError.at(path, line_number, "hash_ids", "expected a list of non-negative integers")
    expected = math.ceil(record["input_length"] / block_tokens)
    if len(ids) != expected:
        raise InputError.at(
            path,
            line_number,
            "hash_ids",
            f"{len(ids)} ids for input_length {record['input_length']} (expected {expected} at "
            f"{block_tokens} tokens per block)",
        )
    return record


def _request(index: int, record: dict, block_tokens: int) -> Request:
    output = int(record["output_length"])
    return Request(
        index,
        f"r{index:06d}",
        f"r{index:06d}",
        0,
        hash_id_tokens(record["hash_ids"], int(record["input_length"]), block_tokens=block_tokens),
        arrival_s=record["timestamp"] / 1000.0,
        max_tokens=output or DEFAULT_MAX_TOKENS,
        output_tokens=output or None,
    )


def mooncake_records(
    file: JsonlFile, limit: int | None = None, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[tuple[int, dict]]:
    """``(line number, validated record)`` of an open Mooncake file (at most ``limit``), in file order.

    Raises:
        InputError: a malformed line (names file, line and field), or no line at all.
    """
    records = []
    for line_number, line in file.lines():
        record = json_object(file.path, line_number, line)
        records.append((line_number, checked_record(file.path, line_number, record, block_tokens)))
        if limit is not None and len(records) >= limit:
            break
    if not records:
        raise InputError(f"{file.path}: no requests in the file")
    return records


def read_mooncake_lines(
    file: JsonlFile, limit: int | None = None, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[Request]:
    """The requests of an open Mooncake file (at most ``limit``), in file order. Raises ``InputError``."""
    records = mooncake_records(file, limit, block_tokens)
    return [_request(index, record, block_tokens) for index, (_, record) in enumerate(records)]


def read_mooncake(path: str | Path, limit: int | None = None) -> list[Request]:
    """Open and read a Mooncake trace (see :func:`read_mooncake_lines`).

    Raises:
        InputError: the file is missing or unreadable, or a line is malformed.
    """
    with open_jsonl(path) as file:
        return read_mooncake_lines(file, limit)
