"""Checks of a run's settings against its trace and its model, made before any request is served.

Each turns a setting that would measure nothing, or fail every request, into one ``InputError``
line naming the flag (before, ``--max-tokens 100000`` failed every request one by one;
``--block-size 100000`` ran with "1 blocks"; ``--cache-size abc`` took 7-10 s, the model load, to be
refused), or into a note the run prints (``--requests`` beyond the trace's length).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.words import counted


def check_cache_size_text(text: str) -> None:
    """Raise ``InputError`` unless ``text`` is a block count or a byte size (the model is not needed
    to know that ``abc`` is neither)."""
    from kvbench.memory.layout import parse_bytes

    text = str(text).strip()
    if text.replace("_", "").isdigit():
        if int(text.replace("_", "")) == 0:  # no model needed to know 0 blocks hold nothing
            raise InputError("--cache-size 0: holds no block (give a block count >= 1, or bytes: 2GiB)")
        return
    try:
        parse_bytes(text)
    except InputError as exc:
        raise InputError(f"--cache-size: {exc}") from None


def check_against_model(requests: Sequence[Request], block_size: int, max_context_tokens: int | None) -> None:
    """Raise ``InputError`` when no request can fit the model's context (prompt + ``max_tokens``),
    naming the first that does not, or when a block is longer than the context (no block could ever
    fill, so nothing could be cached)."""
    if max_context_tokens is None:
        return
    if block_size > max_context_tokens:
        raise InputError(
            f"--block-size {block_size}: longer than the model's context of {max_context_tokens:,} "
            "tokens, so no block could ever be full and nothing would be cached"
        )
    for request in requests:
        if request.prompt_tokens + request.max_tokens > max_context_tokens:
            raise InputError(
                f"request {request.request_id}: {request.prompt_tokens:,} prompt tokens + max_tokens "
                f"{request.max_tokens:,} exceed the model's context of {max_context_tokens:,} tokens "
                "(lower --max-tokens or shorten the workload)"
            )


def requests_note(
    num_asked: int | None, num_available: int, num_done: int | None = None, done: str = "run"
) -> list[str]:
    """A note when ``--requests`` asked for more than the source has. ``num_done``: how many were
    really sent (``--duration`` or a dead server can stop sending early; default all), ``done`` the
    verb ("run", "simulated")."""
    if num_asked is None or num_asked <= num_available:
        return []
    head = f"--requests {num_asked:,}: the source has only {counted(num_available, 'request')}"
    if num_done is None or num_done >= num_available:
        return [f"{head}; all of them were {done}"]
    return [f"{head}; {num_done:,} of them were {done} before sending stopped"]
