"""``kvbench play``: the interactive prefix cache (a Textual terminal app)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvbench.cache.base import CacheKind
from kvbench.errors import InputError
from kvbench.extras import needs_extra


def play(
    cache_kind: Annotated[
        CacheKind, typer.Option(help="Cache structure to start with (k switches).")
    ] = CacheKind.HASH,
) -> None:
    """A 16-block pool with two system prompts, a growing chat and one-offs: send them with keys and
    watch hits, pins, evictions (tail first) and TTL expiry happen. Needs a terminal: with stdin or
    stdout not a TTY (a pipe, a file, CI) it refuses in one line (exit 2) instead of writing escape
    codes until killed."""
    try:  # the extra first: without it, a terminal would not help
        from kvbench.play.app import PlayApp
    except ImportError as exc:
        raise InputError(f"kvbench play {needs_extra('play', exc)}") from None
    not_tty = [
        name
        for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout))
        if stream is None or not stream.isatty()
    ]
    if not_tty:
        raise InputError(
            f"kvbench play is an interactive terminal app: {' and '.join(not_tty)} "
            f"{'is' if len(not_tty) == 1 else 'are'} not a terminal (run it in one, without pipes "
            "or redirects)"
        )
    PlayApp(cache_kind).run()


def register(app: typer.Typer) -> None:
    app.command("play")(play)
