"""Reading a user's file a line at a time, each line bounded in size.

Every reader of a user file goes through here: the JSONL formats (:mod:`.jsonl`, so kvbench traces,
Mooncake, hash-id, prompts and lengths lines), BurstGPT CSV rows (:mod:`.burstgpt`), the elements
of a ShareGPT JSON array (:mod:`.json_array`) and scenario TOML files (:func:`bounded_text`). A line
longer than the bound is refused with one ``InputError`` naming the file, the line and its size, so a
reader holds one line in memory, never the file: a 1 GB file of one line was read whole before
(7 GB RSS, then ``memory allocation of 31 bytes failed``).

The bound is :func:`max_line_bytes`: :data:`DEFAULT_MAX_LINE_BYTES` unless the CLI's root flag
``kvbench --max-line-bytes N`` (or ``KVBENCH_MAX_LINE_BYTES``) or library code
(``with line_bound(N): ...``) sets another for the current context (a ``ContextVar``, so a bound set
for one command never leaks into the next call in the same process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar, Token
from pathlib import Path
from typing import BinaryIO

from kvbench.errors import InputError

# 64 MiB: twice `kvbench serve`'s 32 MiB body limit; a 1M-token prompt is ~4 MB
DEFAULT_MAX_LINE_BYTES = 64 * 2**20
_SKIP_CHUNK_BYTES = 2**20  # what is read at a time past the bound, to count an over-long line's size
_MAX_LINE_BYTES: ContextVar[int] = ContextVar("kvbench_max_line_bytes", default=DEFAULT_MAX_LINE_BYTES)


def max_line_bytes() -> int:
    """The bound on one line (bytes, its newline not counted) in the current context."""
    return _MAX_LINE_BYTES.get()


def set_max_line_bytes(num_bytes: int) -> Token:
    """Set the bound for the current context; returns the token that :meth:`ContextVar.reset` takes.

    Raises:
        ValueError: ``num_bytes`` is not a positive integer.
    """
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes < 1:
        raise ValueError(f"max_line_bytes must be a positive integer, got {num_bytes!r}")
    return _MAX_LINE_BYTES.set(num_bytes)


def reset_max_line_bytes(token: Token) -> None:
    """Undo the :func:`set_max_line_bytes` that returned ``token``."""
    _MAX_LINE_BYTES.reset(token)


@contextlib.contextmanager
def line_bound(num_bytes: int) -> Iterator[None]:
    """Read with a bound of ``num_bytes`` per line inside the ``with`` block."""
    token = set_max_line_bytes(num_bytes)
    try:
        yield
    finally:
        _MAX_LINE_BYTES.reset(token)


def too_long(path: Path, where: str, num_bytes: int | str, limit: int) -> InputError:
    """The one-line refusal of a line (or element) over the bound; ``where`` is ``":LINE"`` or a
    phrase such as ``": conversation 3"``."""
    size = f"{num_bytes:,}" if isinstance(num_bytes, int) else num_bytes
    return InputError(
        f"{path}{where}: {size} bytes is longer than the bound of {limit:,} bytes per line "
        "(kvbench --max-line-bytes N raises it)"
    )


def open_binary(path: Path) -> BinaryIO:
    """``path`` opened for reading bytes. Raises ``InputError`` (cannot read: missing, a folder, ...)."""
    try:
        return path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None


def _line_size(handle: BinaryIO, raw: bytes) -> int:
    """The size in bytes (its ``\n`` or ``\r\n`` not counted) of the line that starts with ``raw``;
    the rest of it is read and dropped a chunk at a time."""
    size, last = len(raw), raw
    while not last.endswith(b"\n") and (chunk := handle.readline(_SKIP_CHUNK_BYTES)):
        size += len(chunk)
        last = last[-1:] + chunk
    return size - (2 if last.endswith(b"\r\n") else 1 if last.endswith(b"\n") else 0)


def utf8(path: Path, number: int, raw: bytes) -> str:
    """``raw`` (line ``number`` of ``path``) decoded. Raises ``InputError`` naming the byte and column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} on line {number}, column {exc.start + 1})"
        ) from None


def numbered_lines(handle: BinaryIO, path: Path, keep_ends: bool = False) -> Iterator[tuple[int, str]]:
    """Every line of ``handle`` as ``(1-based line number, text)``; the text without its ``\\n`` or
    ``\\r\\n`` unless ``keep_ends``. Reads at most the bound plus two bytes at a time.

    Raises:
        InputError: a line longer than :func:`max_line_bytes` (file, line, its size in bytes), or a
            line that is not UTF-8.
    """
    limit = max_line_bytes()
    number = 0
    while raw := handle.readline(limit + 2):
        number += 1
        end = 2 if raw.endswith(b"\r\n") else 1 if raw.endswith(b"\n") else 0
        if len(raw) - end > limit:
            raise too_long(path, f":{number}", _line_size(handle, raw), limit)
        text = utf8(path, number, raw)
        yield number, (text if keep_ends or not end else text[:-end])


def bounded_text(path: Path) -> str:
    """A small file read whole (a scenario), refused when larger than :func:`max_line_bytes`.

    Raises:
        InputError: cannot read, larger than the bound (its size named), or not UTF-8.
    """
    limit = max_line_bytes()
    with open_binary(path) as handle:
        raw = handle.read(limit + 1)
        if len(raw) > limit:
            size = len(raw) + sum(len(chunk) for chunk in iter(lambda: handle.read(_SKIP_CHUNK_BYTES), b""))
            raise InputError(
                f"{path}: {size:,} bytes is larger than the bound of {limit:,} bytes "
                "(kvbench --max-line-bytes N raises it)"
            )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
