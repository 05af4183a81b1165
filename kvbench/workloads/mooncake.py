"""Replay of Mooncake traces (kvcache-ai/Mooncake, ``FAST25-release/traces``) as token ids.

Each line: ``timestamp`` (ms from the trace start), ``input_length`` and ``output_length`` (tokens),
``hash_ids`` (one id per 512-token block of the prompt, prefix-chained: equal ids at equal positions
mean an equal prefix). There is no text, so each hash id becomes a fixed pseudo-random block of 512
token ids derived from the id alone (equal ids give equal tokens); the last block is cut to the
request's input length. Token ``j`` of id ``h`` is ``splitmix64(h * 512 + j) mod vocab_size``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from kvbench.errors import InputError
from kvbench.workloads.token_ids import CL100K_VOCAB_SIZE, TokenRequest

MOONCAKE_BLOCK_TOKENS = 512  # the traces' hash_ids name 512-token blocks (FAST'25 README)
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, elementwise on uint64 (wrapping arithmetic); same shape."""
    with np.errstate(over="ignore"):
        z = values + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hash_id_tokens(hash_ids: list[int], num_tokens: int, vocab_size: int = CL100K_VOCAB_SIZE) -> np.ndarray:
    """Token ids for a prompt made of the blocks ``hash_ids``, cut to ``num_tokens``; uint32."""
    positions = np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.uint64)
    ids = np.asarray(hash_ids, dtype=np.uint64)[:, None] * np.uint64(MOONCAKE_BLOCK_TOKENS)
    tokens = splitmix64((ids + positions).reshape(-1)[:num_tokens]) % np.uint64(vocab_size)
    return tokens.astype(np.uint32)


def is_mooncake_record(record: dict) -> bool:
    """Whether a parsed JSON line looks like a Mooncake trace line."""
    return "hash_ids" in record and "input_length" in record


def _checked_record(path: Path, line_number: int, line: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError.at(path, line_number, None, f"not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise InputError.at(path, line_number, None, "expected a JSON object")
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
    expected = math.ceil(record["input_length"] / MOONCAKE_BLOCK_TOKENS)
    if len(ids) != expected:
        raise InputError.at(path, line_number, "hash_ids",
                            f"{len(ids)} ids for input_length {record['input_length']} (expected {expected})")
    return record


def read_mooncake(path: str | Path, limit: int | None = None) -> list[TokenRequest]:
    """Read and validate a Mooncake trace; one :class:`TokenRequest` per line, in file order.

    Raises:
        InputError: the file is missing, or a line is malformed (names file, line and field).
    """
    path = Path(path)
    requests: list[TokenRequest] = []
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    with handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = _checked_record(path, line_number, line)
            requests.append(TokenRequest(
                hash_id_tokens(record["hash_ids"], int(record["input_length"])),
                arrival_s=record["timestamp"] / 1000.0,
                output_tokens=int(record["output_length"]),
            ))
            if limit is not None and len(requests) >= limit:
                break
    if not requests:
        raise InputError(f"{path}: no requests in the file")
    return requests
