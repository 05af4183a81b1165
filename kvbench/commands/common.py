"""Helpers shared by the command modules: consoles, config building, progress, interrupts."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console

from kvbench.errors import checked, note_stop_signal

PIPE_WIDTH = 120  # columns when output is not a terminal (files, CI logs), so tables stay readable
PLAIN_PROGRESS_EVERY_S = 30.0  # outside a terminal (nohup, CI, a file): one progress line this often
T = TypeVar("T")

if TYPE_CHECKING:
    from kvbench.results.rows import ResultRow


def make_console(stderr: bool = False) -> Console:
    """A rich console; 120 columns wide when writing to a pipe or file instead of 80. No emoji codes:
    file names and ``path:100:`` locations print as written."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(file=stream, width=width, highlight=False, emoji=False)


build = checked  # flags -> a frozen config; its ValueError -> one InputError line


class _Terminate:
    """A SIGTERM handler that raises ``KeyboardInterrupt`` and remembers that it did: a signal that
    lands inside code which swallows exceptions (a ``__del__``) is still honoured afterwards."""

    def __init__(self) -> None:
        self.received = False

    def __call__(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        self.received = True
        note_stop_signal(signum)
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C, so every ``finally`` runs and measured results are written.
    (While requests are in flight, :func:`kvbench.run.execute.execute` lets the event loop handle it.)"""
    handler = _Terminate()
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
    if handler.received:
        raise KeyboardInterrupt  # the signal was swallowed on the way: still stop with 130


def plain_progress(
    console: Console,
    update: Callable[[list[ResultRow], int], None],
    every_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[list[ResultRow], int], None]:
    """``update`` plus, every ``every_s`` seconds (default :data:`PLAIN_PROGRESS_EVERY_S`), one plain
    line on ``console``: ``progress: 120/1,000 requests, 2 failed, 3m12s``. For output that is not a
    terminal, where a live bar shows nothing until the end (a 14-minute run under nohup showed a blank)."""
    interval_s = PLAIN_PROGRESS_EVERY_S if every_s is None else every_s
    started_s = clock()
    last_s = [started_s]

    def plain(rows: list[ResultRow], total: int) -> None:
        update(rows, total)
        now_s = clock()
        if now_s - last_s[0] >= interval_s:
            last_s[0] = now_s
            failed = sum(1 for row in rows if row.status != "ok")
            elapsed = int(now_s - started_s)
            console.print(
                f"progress: {len(rows):,}/{total:,} requests, {failed:,} failed, "
                f"{elapsed // 60}m{elapsed % 60:02d}s",
                soft_wrap=True,
                highlight=False,
            )
            console.file.flush()

    return plain


def progress_every_s() -> float:
    """Seconds between plain progress lines and heartbeats outside a terminal: ``KVBENCH_PROGRESS_EVERY_S``
    (for tests and impatient logs; > 0) or :data:`PLAIN_PROGRESS_EVERY_S`."""
    try:
        value = float(os.environ.get("KVBENCH_PROGRESS_EVERY_S", PLAIN_PROGRESS_EVERY_S))
    except ValueError:
        return PLAIN_PROGRESS_EVERY_S
    return value if value > 0 else PLAIN_PROGRESS_EVERY_S


def status_printer(console: Console) -> Callable[[str], None]:
    """A library's ``on_status(line)``: the line on ``console`` at once, flushed (a pipe or a file gets
    it when it happens, not when the command ends)."""

    def say(line: str) -> None:
        console.print(line, soft_wrap=True, highlight=False)
        console.file.flush()

    return say


class Heartbeat:
    """Outside a terminal, a timer thread prints one line every ``every_s`` seconds while nothing else
    tells the reader the command is alive: ``working: 1m00s, TEXT`` (``TEXT`` from :meth:`set`; before
    any, "no request finished yet"). In a terminal it prints nothing (the live bar shows the time)."""

    def __init__(self, console: Console, every_s: float | None = None) -> None:
        self.console, self.every_s = console, progress_every_s() if every_s is None else every_s
        self.text = "no request finished yet"
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="kvbench-heartbeat", daemon=True)

    def set(self, text: str) -> None:
        self.text = text

    def stop(self) -> None:
        self._stopped.set()

    def _beat(self) -> None:
        started_s = time.monotonic()
        while not self._stopped.wait(self.every_s):
            elapsed = int(time.monotonic() - started_s)
            status_printer(self.console)(f"working: {elapsed // 60}m{elapsed % 60:02d}s, {self.text}")

    def __enter__(self) -> Heartbeat:
        if not self.console.is_terminal:
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def run_with_progress(
    body: Callable[[Callable[[list[ResultRow], int], None], Callable[[str], None]], T],
    on_interrupt: Callable[[Any], None] | None = None,
) -> T:
    """Run ``body(on_progress, on_status)`` under a live progress line on stderr; SIGTERM acts as Ctrl-C.
    ``on_status`` prints a status line at once (:func:`status_printer`). Outside a terminal, a
    :class:`Heartbeat` until the first request finishes, then a plain progress line every
    :func:`progress_every_s`. On a :class:`kvbench.run.execute.RunInterrupted`, ``on_interrupt(it)``
    runs before it propagates (the CLI prints its one line and exits 130)."""
    from kvbench.commands.live_progress import progress_line
    from kvbench.run.execute import RunInterrupted

    err = make_console(stderr=True)
    with progress_line(err) as update, sigterm_as_interrupt(), Heartbeat(err) as heartbeat:
        if not err.is_terminal:
            update = _after_first(heartbeat.stop, plain_progress(err, update, progress_every_s()))
        try:
            return body(update, status_printer(err))
        except RunInterrupted as interrupted:
            if on_interrupt is not None:
                on_interrupt(interrupted)
            raise


def _after_first(
    first: Callable[[], None], update: Callable[[list[ResultRow], int], None]
) -> Callable[[list[ResultRow], int], None]:
    """``update``, calling ``first()`` before it every time (stopping a heartbeat is idempotent)."""

    def both(rows: list[ResultRow], total: int) -> None:
        first()
        update(rows, total)

    return both
