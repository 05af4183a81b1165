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


HOST_TIER_FLAG = "--host-tier"


def memory_bytes() -> int | None:
    """The machine's physical memory in bytes (``sysconf``), or ``None`` where it cannot be read."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _whole_blocks(text: str) -> int | None:
    """A block count written as ASCII digits (``4096``, ``4_096``), else ``None`` (``²`` is a digit to
    ``str.isdigit`` but not to ``int``)."""
    digits = text.replace("_", "")
    return int(digits) if digits.isascii() and digits.isdigit() else None


def check_host_tier_text(text: str | None) -> None:
    """Raise ``InputError`` naming ``--host-tier`` unless ``text`` (``None``: no tier) is a block
    count >= 1 or a byte size that fits in this machine's memory: made before the model loads (a tier
    of 50,000,000 blocks reached 3.7 GB RSS before the allocator failed; ``abc`` and ``-1`` failed
    only after the model loaded). The count of blocks a size holds is checked by
    :func:`host_tier_blocks` once the block's bytes are known."""
    from kvbench.memory.layout import format_bytes, parse_bytes

    if text is None:
        return
    text = str(text).strip()
    blocks = _whole_blocks(text)
    if blocks == 0:
        raise InputError(f"{HOST_TIER_FLAG} 0: holds no block (leave the flag out for no host tier)")
    if blocks is not None:
        return
    try:
        num_bytes = parse_bytes(text)
    except InputError as exc:
        raise InputError(f"{HOST_TIER_FLAG}: {exc} (or a block count >= 1)") from None
    memory = memory_bytes()
    if memory is not None and num_bytes > memory:
        raise InputError(
            f"{HOST_TIER_FLAG} {text}: {format_bytes(num_bytes)} is more than this machine's memory "
            f"({format_bytes(memory)})"
        )


def host_tier_blocks(text: str | None, bytes_per_block: int) -> int:
    """``--host-tier``: blocks (a bare integer) or bytes with a unit (``2GiB``) -> whole blocks of
    ``bytes_per_block`` bytes; 0 when ``text`` is ``None``.

    Raises:
        InputError: naming the flag: not a size (:func:`check_host_tier_text`), no whole block, or
            more bytes than this machine's memory (checked before anything is allocated).
    """
    from kvbench.memory.layout import format_bytes

    if text is None:
        return 0
    check_host_tier_text(text)
    text = str(text).strip()
    blocks = _whole_blocks(text)
    if blocks is None:
        from kvbench.memory.layout import parse_bytes

        blocks = parse_bytes(text) // bytes_per_block
        if blocks < 1:
            raise InputError(
                f"{HOST_TIER_FLAG} {text}: holds no block (one block is {bytes_per_block:,} bytes)"
            )
    memory = memory_bytes()
    if memory is not None and blocks * bytes_per_block > memory:
        raise InputError(
            f"{HOST_TIER_FLAG} {text}: {blocks:,} blocks of {bytes_per_block:,} bytes "
            f"({format_bytes(blocks * bytes_per_block)}) are more than this machine's memory "
            f"({format_bytes(memory)})"
        )
    return blocks


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
