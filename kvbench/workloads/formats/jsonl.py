"""Opening a JSONL trace once: the first line decides the format, and the reader continues the file.

:func:`open_jsonl` reads the first non-empty line, parses it and hands the open file (its remaining
lines) to whichever reader :attr:`JsonlFile.format` names; no file is opened twice. The formats, checked
in order on the first parsed line (a literal table, :data:`FORMATS`):

* ``kvbench-trace``: a header line with ``kvbench_trace`` (:mod:`.kvbench_trace`);
* ``hash-ids``: ``hash_ids`` and ``chat_id`` (16-token blocks with sessions: :mod:`.hash_ids`);
* ``mooncake``: ``hash_ids`` and ``input_length`` (:mod:`.mooncake`);
* ``jsonl``: a ``prompt`` or ``messages`` field (plain prompts: :mod:`.prompts`);
* ``lengths``: any other JSON object, the lengths-only lines of :mod:`.lengths` (read only by
  ``kvbench memory waste``, which needs no token ids).

Every error is an ``InputError`` of one line naming the file (and the line where there is one).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from kvbench.errors import InputError
from kvbench.workloads.formats.lines import numbered_lines, open_binary

KVBENCH_TRACE = "kvbench-trace"
MOONCAKE = "mooncake"
HASH_IDS = "hash-ids"
PROMPTS = "jsonl"
LENGTHS = "lengths"
TOO_DEEP = "not valid JSON (nested too deeply: Python's JSON reader stops near 1,000 levels)"


def is_trace_header(record: Any) -> bool:
    """Whether a parsed first line is a kvbench trace header."""
    return isinstance(record, dict) and "kvbench_trace" in record


def is_mooncake_record(record: Any) -> bool:
    """Whether a parsed JSON line looks like a Mooncake trace line."""
    return isinstance(record, dict) and "hash_ids" in record and "input_length" in record


def is_prompt_record(record: Any) -> bool:
    """Whether a parsed JSON line is a plain prompt line (``prompt`` or ``messages``, no header)."""
    return isinstance(record, dict) and ("prompt" in record or "messages" in record)


FORMATS: MappingProxyType[str, Callable[[Any], bool]] = MappingProxyType(
    {
        KVBENCH_TRACE: is_trace_header,
        HASH_IDS: lambda record: isinstance(record, dict) and "hash_ids" in record and "chat_id" in record,
        MOONCAKE: is_mooncake_record,
        PROMPTS: is_prompt_record,
        LENGTHS: lambda record: isinstance(record, dict),
    }
)


@dataclass
class JsonlFile:
    """An open JSONL file after its first non-empty line.

    Attributes:
        path: the file, for error messages.
        first_number / first_text / first: that line's 1-based number, its text (no newline) and its
            parsed value (any JSON value); all ``None`` for a file with no non-empty line.
        rest: the following non-empty lines as ``(line_number, text)``, read lazily from the file.
        handle: the open file, just past the first non-empty line until ``rest`` is read, for a
            reader that takes the rest a block at a time (:mod:`.trace_columns`; it must leave the
            position where it found it when it gives the file back to ``rest``).
    """

    path: Path
    first_number: int | None
    first_text: str | None
    first: Any
    rest: Iterator[tuple[int, str]]
    handle: BinaryIO | None = None

    @property
    def format(self) -> str | None:
        """The first format of :data:`FORMATS` that accepts the first line, else ``None``."""
        return next((name for name, accepts in FORMATS.items() if accepts(self.first)), None)

    def lines(self) -> Iterator[tuple[int, str]]:
        """Every non-empty line, the first included, as ``(line_number, text)``."""
        if self.first_number is not None:
            yield self.first_number, self.first_text or ""
        yield from self.rest

    def error(self, line: int | None, field: str | None, problem: str) -> InputError:
        return InputError.at(self.path, line, field, problem)


def json_object(path: Path, line_number: int, text: str) -> dict[str, Any]:
    """Parse one line that must be a JSON object. Raises ``InputError`` (file, line)."""
    record = _parse(path, line_number, text)
    if not isinstance(record, dict):
        raise InputError.at(path, line_number, None, "expected a JSON object")
    return record


def _parse(path: Path, line_number: int, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError.at(path, line_number, None, f"not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError.at(path, line_number, None, TOO_DEEP) from None


def _numbered(handle: BinaryIO, path: Path) -> Iterator[tuple[int, str]]:
    for number, line in numbered_lines(handle, path):
        if line.strip():
            yield number, line


@contextlib.contextmanager
def open_jsonl(path: str | Path) -> Iterator[JsonlFile]:
    """Open ``path`` and read its first non-empty line (see :class:`JsonlFile`).

    Lines are read through :func:`.lines.numbered_lines`: one at a time, each at most
    :func:`.lines.max_line_bytes` long.

    Raises:
        InputError: the file cannot be read, or (also later, while ``rest`` is read) a line is longer
            than the bound or not UTF-8 text; its first line is not valid JSON.
    """
    path = Path(path)
    with open_binary(path) as handle:
        lines = _numbered(handle, path)
        first = next(lines, None)
        if first is None:
            yield JsonlFile(path, None, None, None, iter(()))
        else:
            yield JsonlFile(path, first[0], first[1], _parse(path, *first), lines, handle)
