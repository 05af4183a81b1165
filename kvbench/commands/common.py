"""Helpers shared by the command modules."""

from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 120  # columns when output is not a terminal (files, CI logs), so tables stay readable


def make_console(stderr: bool = False) -> Console:
    """A rich console; 120 columns wide when writing to a pipe or file instead of 80."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(file=stream, width=width, highlight=False)
