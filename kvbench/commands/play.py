"""``kvbench play``: the interactive prefix cache (a Textual terminal app)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvbench.cache.base import CacheKind
from kvbench.errors import InputError
from kvbench.extras import needs_extra


def play(
    cache_kind: Annotated[CacheKind, typer.Option(help="Cache structure to start with (k switches).")] = CacheKind.HASH,
) -> None:
    """A 16-block pool with two system prompts, a growing chat and one-offs: send them with keys and
    watch hits, pins, evictions (tail first) and TTL expiry happen."""
    try:
        from kvbench.play.app import PlayApp
    except ImportError as exc:
        raise InputError(f"kvbench play {needs_extra('play', exc)}") from None
    PlayApp(cache_kind).run()


def register(app: typer.Typer) -> None:
    app.command("play")(play)
