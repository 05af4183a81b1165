"""Errors the CLI turns into one clear line and a non-zero exit code.

Library code raises these (or plain ``ValueError`` for programming errors in config objects);
``kvbench.cli`` catches ``KvbenchError`` and prints ``error: <message>`` without a traceback.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_STOP_SIGNALS: list[int] = []  # process-wide, as signals are: the stop signals received, in order


def note_stop_signal(signum: int) -> None:
    """Record that this process received ``signum`` (SIGTERM; SIGINT needs no record), whichever
    handler caught it, so the CLI's exit code says which signal stopped the command."""
    _STOP_SIGNALS.append(signum)


def interrupt_exit_code() -> int:
    """The exit code of a command stopped by a signal: 128 + the first stop signal received (the shell's
    convention: 143 for SIGTERM), else 130 (Ctrl-C, a KeyboardInterrupt)."""
    return 128 + _STOP_SIGNALS[0] if _STOP_SIGNALS else 128 + signal.SIGINT


def sigterm_interrupts(signum: int, frame: object) -> None:  # noqa: ARG001 - a signal handler's signature
    """A SIGTERM handler: record it and unwind as Ctrl-C does (every ``finally`` runs, results are
    written, the CLI prints one line and exits 143). The CLI installs it for every command."""
    note_stop_signal(signum)
    raise KeyboardInterrupt


class KvbenchError(Exception):
    """Base class: a known failure with a message meant for the user.

    Attributes:
        exit_code: the process exit code the CLI uses (2 = bad input, 1 = run failed).
    """

    exit_code: int = 1


class InputError(KvbenchError):
    """Bad user input: a missing or malformed file, an unknown key, an out-of-range value."""

    exit_code = 2

    @classmethod
    def at(cls, path: str | Path, line: int | None, field: str | None, problem: str) -> InputError:
        """Build the one-line message ``FILE:LINE: field 'F': problem`` (line and field optional)."""
        where = str(path)
        if line is not None:
            where += f":{line}"
        if field is not None:
            return cls(f"{where}: field '{field}': {problem}")
        return cls(f"{where}: {problem}")


class Interrupted(KvbenchError):
    """Ctrl-C or SIGTERM: what was measured is written; the message says how far the work got. The
    CLI exits :func:`interrupt_exit_code` (130, or 143 after SIGTERM)."""

    exit_code = 130


class CacheBusyError(KvbenchError):
    """An operation that needs an idle cache (reset) found pinned blocks."""

    exit_code = 1


def checked(factory: Callable[[], T], names: Mapping[str, str] | None = None) -> T:
    """``factory()``, typically a frozen config validated in ``__post_init__``, with its ``ValueError``
    turned into one :class:`InputError` line (the configs' messages name the field or flag).

    ``names`` maps a config field to what the user typed (``{"hash_bits": "--bits"}``, or a scenario
    key such as ``"scenario key cache.ttl_s"``): a message that starts with the field's name starts with that
    instead (``hash_bits must be ...`` -> ``--bits: must be ...``)."""
    try:
        return factory()
    except ValueError as exc:
        raise InputError(user_named(str(exc), names or {})) from None


def user_named(message: str, names: Mapping[str, str]) -> str:
    """``message`` with a leading config field name replaced by its flag or key (see :func:`checked`)."""
    for field, name in names.items():
        if message.startswith(field + " ") or message.startswith(field + ":"):
            return f"{name}: {message[len(field) :].lstrip(': ')}"
    return message
