"""Helpers shared by the command modules: consoles, config building, progress, interrupts."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import typer
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


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind like Ctrl-C, so every ``finally`` runs and measured results are written."""
    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_with_progress(body: Callable[[Callable[[list[dict[str, Any]], int], None]], T],
                      on_interrupt: Callable[[Any], None] | None = None) -> T:
    """Run ``body(on_progress)`` under a live progress line on stderr; SIGTERM acts as Ctrl-C. A
    :class:`kvbench.run.execute.RunInterrupted` prints its one line (after ``on_interrupt(it)``)
    and exits 130."""
    from kvbench.results.writer import progress_line
    from kvbench.run.execute import RunInterrupted

    err = make_console(stderr=True)
    with progress_line(err) as update, sigterm_as_interrupt():
        try:
            return body(update)
        except RunInterrupted as interrupted:
            if on_interrupt is not None:
                on_interrupt(interrupted)
            err.print(f"[red]interrupted[/red] {str(interrupted).removeprefix('interrupted ')}")
            raise typer.Exit(130) from None
