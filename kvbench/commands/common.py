"""Helpers shared by the command modules: consoles, config building, progress, interrupts."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from rich.console import Console

from kvbench.errors import checked

PIPE_WIDTH = 120  # columns when output is not a terminal (files, CI logs), so tables stay readable
PLAIN_PROGRESS_EVERY_S = 30.0  # outside a terminal (nohup, CI, a file): one progress line this often
T = TypeVar("T")


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


def plain_progress(console: Console, update: Callable[[list[dict[str, Any]], int], None],
                   every_s: float | None = None, clock: Callable[[], float] = time.monotonic
                   ) -> Callable[[list[dict[str, Any]], int], None]:
    """``update`` plus, every ``every_s`` seconds (default :data:`PLAIN_PROGRESS_EVERY_S`), one plain
    line on ``console``: ``progress: 120/1,000 requests, 2 failed, 3m12s``. For output that is not a
    terminal, where a live bar shows nothing until the end (issue 19: a 14-minute blank under nohup)."""
    interval_s = PLAIN_PROGRESS_EVERY_S if every_s is None else every_s
    started_s = clock()
    last_s = [started_s]

    def plain(rows: list[dict[str, Any]], total: int) -> None:
        update(rows, total)
        now_s = clock()
        if now_s - last_s[0] >= interval_s:
            last_s[0] = now_s
            failed = sum(1 for row in rows if row["status"] != "ok")
            elapsed = int(now_s - started_s)
            console.print(f"progress: {len(rows):,}/{total:,} requests, {failed:,} failed, "
                          f"{elapsed // 60}m{elapsed % 60:02d}s", soft_wrap=True, highlight=False)
            console.file.flush()

    return plain


def run_with_progress(body: Callable[[Callable[[list[dict[str, Any]], int], None]], T],
                      on_interrupt: Callable[[Any], None] | None = None, threads: int | None = None) -> T:
    """Run ``body(on_progress)`` under a live progress line on stderr; SIGTERM acts as Ctrl-C. On a
    :class:`kvbench.run.execute.RunInterrupted`, ``on_interrupt(it)`` runs before it propagates
    (the CLI prints its one line and exits 130). ``threads``: torch's intra-op threads meanwhile
    (``--threads``; :func:`kvbench.engine.threads.torch_threads`)."""
    from kvbench.engine.threads import torch_threads
    from kvbench.results.writer import progress_line
    from kvbench.run.execute import RunInterrupted

    err = make_console(stderr=True)
    with torch_threads(threads), progress_line(err) as update, sigterm_as_interrupt():
        if not err.is_terminal:
            update = plain_progress(err, update)
        try:
            return body(update)
        except RunInterrupted as interrupted:
            if on_interrupt is not None:
                on_interrupt(interrupted)
            raise
