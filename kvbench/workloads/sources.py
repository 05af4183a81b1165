"""Where token-id requests come from: a scenario file or a JSONL trace, detected by content.

JSONL readers register a detector on the first parsed line; the first one that accepts it reads
the file. Scenario files (``.toml``) go through :mod:`kvbench.run.scenario`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import InputError
from kvbench.workloads.mooncake import is_mooncake_record, read_mooncake
from kvbench.workloads.token_ids import TokenRequest
from kvbench.workloads.trace import is_trace_header


@dataclass(frozen=True)
class JsonlReader:
    """A trace format: ``detect(first_record)``, ``read(path, limit)``, and its usual block size."""

    name: str
    detect: Callable[[dict], bool]
    read: Callable[[Path, int | None], list[TokenRequest]]
    default_block_size: int


def _read_kvbench_trace(path: Path, limit: int | None) -> list[TokenRequest]:
    from kvbench.workloads.trace_kinds import read_trace_token_requests  # imports the generators

    return read_trace_token_requests(path, limit)


_READERS: list[JsonlReader] = [
    JsonlReader("kvbench-trace", is_trace_header, _read_kvbench_trace, 16),  # trace_kinds.KVBENCH_TRACE_READER
    JsonlReader("mooncake", is_mooncake_record, lambda p, n: read_mooncake(p, limit=n), 512),
]


def register_jsonl_reader(reader: JsonlReader) -> None:
    """Add a trace format, tried before the ones registered earlier."""
    _READERS.insert(0, reader)


def detect_jsonl(path: Path) -> JsonlReader:
    """The reader for ``path``, chosen from its first non-empty line.

    Raises:
        InputError: unreadable file, first line not JSON, or no reader accepts it.
    """
    try:
        with path.open(encoding="utf-8") as handle:
            first = next((line for line in handle if line.strip()), None)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at {exc.start})") from None
    if first is None:
        raise InputError(f"{path}: the file is empty")
    try:
        record = json.loads(first)
    except json.JSONDecodeError as exc:
        raise InputError.at(path, 1, None, f"not valid JSON ({exc.msg})") from None
    for reader in _READERS:
        if isinstance(record, dict) and reader.detect(record):
            return reader
    raise InputError.at(path, 1, None, "not a known trace format (kvbench trace or Mooncake JSONL)")
