"""Per request: the first token where it diverges from the best earlier request, and the cause of
every token it missed, each with the tokens it cost (the request's waterfall bars,
:mod:`kvbench.explain.waterfall`) and, where there is one, the token offset and excerpts.

Cause kinds: ``never seen`` / a content cause (:mod:`kvbench.explain.content`) / ``new tokens``
(resends an earlier request whole, then more) / ``new message`` (diverges inside the prompt's last
message: the new turn) for the ``new`` bar; ``block floor``; ``last token``; ``different salt``; ``below
provider
minimum``; ``caching off``; ``evicted (capacity)``; ``expired (TTL)``; ``server reported less`` (or ``more``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.explain import content
from kvbench.explain.prefixes import SharedPrefix
from kvbench.explain.replay import LastUse
from kvbench.explain.waterfall import Breakdown
from kvbench.request import Request

FRAGILE_KINDS = ("content differs", "volatile value")  # in the last message, these are just the new turn
OWN_NEW_KINDS = ("never seen", "new tokens", "new message", "content differs")  # new content, no named cause


@dataclass(frozen=True)
class Cause:
    """Why ``tokens`` tokens of a request were not cached. ``offset_tokens``: where it applies (a
    token index in the prompt) or ``None``; ``excerpt`` / ``earlier_excerpt``: both texts there."""

    kind: str
    tokens: int
    offset_tokens: int | None
    detail: str
    excerpt: str | None = None
    earlier_excerpt: str | None = None


@dataclass(frozen=True)
class Context:
    """What a request's causes are computed from (positions are replay order)."""

    requests: Sequence[Request]
    sequences: Sequence[np.ndarray]  # stored sequence per position (prompt + output - 1)
    block_size: int
    capacity_blocks: int
    ttl_s: float | None
    min_cacheable_tokens: int | None
    tokenizer: object | None
    routed: bool = False  # a run behind a router: the server bar is against the router's replica


def new_tokens_cause(ctx: Context, position: int, shared: SharedPrefix, tokens: int) -> Cause | None:
    """The ``new`` bar: never seen, plain new content after an earlier request, or a content cause."""
    request = ctx.requests[position]
    if tokens == 0:
        return None
    if shared.earlier is None or shared.tokens == 0:
        return Cause("never seen", tokens, 0, "no earlier request starts with the same token")
    earlier, sequence = ctx.requests[shared.earlier], ctx.sequences[shared.earlier]
    if shared.tokens >= len(sequence):
        return Cause(
            "new tokens",
            tokens,
            shared.tokens,
            f"resends all of {earlier.request_id} ({len(sequence):,} tokens), then new content",
        )
    if ctx.tokenizer is None:
        return Cause("content differs", tokens, shared.tokens, f"diverges from {earlier.request_id} here")
    finding = content.detect(
        ctx.tokenizer, request.token_ids, sequence, shared.tokens, request.messages, earlier.messages
    )
    kind, detail = finding.kind, f"vs {earlier.request_id}: {finding.detail}"
    if finding.kind.startswith(FRAGILE_KINDS) and shared.tokens >= content.last_message_offset(
        ctx.tokenizer, request.messages
    ):
        kind, detail = (
            "new message",
            f"diverges from {earlier.request_id} in the last message ({finding.kind})",
        )
    return Cause(kind, tokens, finding.offset_tokens, detail, finding.excerpt, finding.earlier_excerpt)


def request_causes(
    ctx: Context,
    position: int,
    bars: Breakdown,
    same: SharedPrefix,
    any_: SharedPrefix,
    last_use: LastUse | None,
    reported: int | None,
) -> list[Cause]:
    """Every cause of one request's misses, in waterfall order (each with its bar's tokens)."""
    request, tokens = ctx.requests[position], bars.tokens
    n, block = request.num_tokens, ctx.block_size
    causes = [new_tokens_cause(ctx, position, any_, tokens["new"])]
    floored = any_.tokens // block * block
    if tokens["block_floor"]:
        causes.append(
            Cause(
                "block floor",
                tokens["block_floor"],
                floored,
                f"{tokens['block_floor']} shared tokens after the last full block (block size {block})",
            )
        )
    if tokens["last_token"]:
        causes.append(
            Cause(
                "last token",
                tokens["last_token"],
                (n - 1) // block * block,
                f"a hit stops at (n - 1) // {block} = {(n - 1) // block} blocks: the last prompt "
                "token is always recomputed",
            )
        )
    if tokens["salt"]:
        other = ctx.requests[any_.earlier]
        causes.append(
            Cause(
                "different salt",
                tokens["salt"],
                same.tokens,
                f"{other.request_id} (salt {other.salt or ''!r}) shares {any_.tokens:,} tokens; "
                f"this request's salt is {request.salt or ''!r}",
            )
        )
    if tokens["provider_minimum"]:
        minimum = ctx.min_cacheable_tokens
        detail = (
            f"{n:,} tokens < the minimum of {minimum:,}: never cached"
            if n < minimum
            else f"only {ctx.requests[same.earlier].request_id} shared it, a prompt below the minimum of "
            f"{minimum:,} tokens, which was never cached"
        )
        causes.append(Cause("below provider minimum", tokens["provider_minimum"], None, detail))
    causes += _lost_in_cache(ctx, position, tokens, bars, last_use)
    allowed = tokens["hit"] + tokens["server"]
    if tokens["routing"]:
        kind = "routed away" if tokens["routing"] > 0 else "routed to more room"
        detail = (
            f"the router's replica allows {allowed:,}; one cache over the trace allows "
            f"{allowed + tokens['routing']:,}"
        )
        causes.append(Cause(kind, tokens["routing"], allowed, detail))
    if tokens["server"]:
        kind = "server reported less" if tokens["server"] > 0 else "server reported more"
        where = "the router's replica" if ctx.routed else "the replayed cache"
        causes.append(
            Cause(kind, tokens["server"], reported, f"reported {reported:,}, {where} allows {allowed:,}")
        )
    return [c for c in causes if c is not None]


def _lost_in_cache(
    ctx: Context, position: int, tokens: dict[str, int], bars: Breakdown, last_use: LastUse | None
) -> list[Cause]:
    request = ctx.requests[position]
    replay_hit = tokens["hit"] + tokens["server"] + tokens["routing"]
    block = replay_hit // ctx.block_size
    where = f"block {block}"
    if last_use is not None:
        earlier = ctx.requests[last_use.position]
        idle_s = request.arrival_s - last_use.arrival_s
        where += (
            f" last used by {earlier.request_id} ({position - last_use.position:,} requests and "
            f"{idle_s:,.1f} s earlier)"
        )
    causes = []
    if tokens["cache_off"]:
        causes.append(
            Cause("caching off", tokens["cache_off"], 0, "the run's prefix caching was off: nothing hits")
        )
    if tokens["capacity"]:
        stored = f"; {last_use.num_blocks_stored_since:,} blocks stored since" if last_use else ""
        causes.append(
            Cause(
                "evicted (capacity)",
                tokens["capacity"],
                replay_hit,
                f"{where}{stored}, capacity {ctx.capacity_blocks:,} blocks",
            )
        )
    if tokens["ttl"]:
        causes.append(
            Cause("expired (TTL)", tokens["ttl"], replay_hit, f"{where}, past the TTL of {ctx.ttl_s:g} s")
        )
    return causes
