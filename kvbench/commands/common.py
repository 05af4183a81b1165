"""Helpers shared by the command modules: consoles, config building, progress, interrupts."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from rich.console import Console

from kvbench.errors import checked

PIPE_WIDTH = 120  # columns when output is not a terminal (files, CI logs), so tables stay readable
T = TypeVar("T")


def make_console(stderr: bool = False) -> Console:
    """A rich console; 120 columns wide when writing to a pipe or file instead of 80."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(file=stream, width=width, highlight=False)


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
        try:
            return body(update)
        except RunInterrupted as interrupted:
            if on_interrupt is not None:
                on_interrupt(interrupted)
            raise
