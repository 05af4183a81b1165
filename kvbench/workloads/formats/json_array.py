"""A top-level JSON array read one element at a time (ShareGPT files are one array of conversations).

:func:`json_array_items` decodes element after element from a buffer of the file's text that holds
about one element: memory is proportional to the largest element, not to the file, and an element
longer than :func:`.lines.max_line_bytes` is refused (the same bound as a JSONL line; a ShareGPT
dump written without indentation is one line, so the bound applies per element here). Each element
is decoded by the standard library's C decoder (``json.JSONDecoder.raw_decode``); when it stops at
the end of the buffer, the buffer is doubled and the element decoded again, so an element of n
bytes costs O(n) in all.

Errors are one ``InputError`` line naming the file, the line and what is wrong (not JSON, not an
array, nested too deeply, an element over the bound), as :func:`json.loads` of the whole file gave.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from kvbench.errors import InputError
from kvbench.workloads.formats.jsonl import TOO_DEEP
from kvbench.workloads.formats.lines import max_line_bytes, open_binary, too_long

_CHUNK_CHARS = 2**16  # the first read of each element; later reads double the buffer
_NEAR_END_CHARS = 16  # a decode error this close to the buffer's end may be a cut element
_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


class _Buffer:
    """The file's text from the current position on: ``text[pos:]``, refilled on demand."""

    def __init__(self, handle: BinaryIO, path: Path) -> None:
        self.handle, self.path = handle, path
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text, self.pos, self.eof, self.line = "", 0, False, 1

    def more(self) -> bool:
        """Read about as much again as is buffered (at least one chunk); ``False`` at the end."""
        if self.eof:
            return False
        self.line += self.text.count("\n", 0, self.pos)
        wanted = max(_CHUNK_CHARS, len(self.text) - self.pos)
        raw = self.handle.read(wanted)
        try:
            chunk = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError:
            raise InputError(f"{self.path}: not UTF-8 text (near line {self.line})") from None
        self.text, self.pos, self.eof = self.text[self.pos :] + chunk, 0, not raw
        return bool(chunk) or not self.eof

    def next_char(self) -> str | None:
        """The next character that is not JSON whitespace (left in place), ``None`` at the end."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more():
                return None

    def line_at(self, pos: int) -> int:
        return self.line + self.text.count("\n", 0, pos)

    def error(self, pos: int, problem: str) -> InputError:
        return InputError.at(self.path, self.line_at(pos), None, problem)


def _element(buffer: _Buffer, index: int, limit: int) -> Any:
    """Decode the element at ``buffer.pos`` (reading more while it may be cut) and step past it."""
    where = f": element {index} (from line {buffer.line_at(buffer.pos)})"
    while True:
        try:
            value, end = _DECODER.raw_decode(buffer.text, buffer.pos)
            if end - buffer.pos > limit:
                raise too_long(buffer.path, where, end - buffer.pos, limit)
            if end < len(buffer.text) or buffer.eof:  # a number or literal cut by the buffer reads short
                buffer.pos = end
                return value
        except json.JSONDecodeError as exc:
            cut = exc.pos >= len(buffer.text) - _NEAR_END_CHARS or exc.msg.startswith("Unterminated string")
            if buffer.eof or not cut:
                raise buffer.error(exc.pos, f"not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise buffer.error(buffer.pos, TOO_DEEP) from None
        if len(buffer.text) - buffer.pos > limit:
            raise too_long(buffer.path, where, f"more than {limit:,}", limit)
        buffer.more()


def json_array_items(path: Path, what: str = "elements") -> Iterator[tuple[int, Any]]:
    """``(0-based index, value)`` of each element of the file's top-level JSON array, in order.

    Raises:
        InputError: unreadable or not UTF-8; not valid JSON (file, line, the decoder's message); not
            an array (``expected a JSON array of {what}``); an element over the bound or nested too
            deeply; anything after the array's ``]``.
    """
    with open_binary(path) as handle:
        buffer = _Buffer(handle, path)
        first = buffer.next_char()
        if first != "[":
            kind = "nothing" if first is None else "an object" if first == "{" else "a JSON value"
            raise InputError(f"{path}: expected a JSON array of {what}, got {kind}")
        buffer.pos += 1
        limit, index = max_line_bytes(), 0
        if buffer.next_char() == "]":
            buffer.pos += 1
        else:
            while True:
                yield index, _element(buffer, index, limit)
                index += 1
                separator = buffer.next_char()
                buffer.pos += 1
                if separator == "]":
                    break
                if separator != "," or buffer.next_char() in (None, "]"):
                    raise buffer.error(
                        buffer.pos - 1, "not valid JSON (expected ',' or ']' between elements)"
                    )
        if buffer.next_char() is not None:
            raise buffer.error(buffer.pos, "not valid JSON (extra data after the array)")
