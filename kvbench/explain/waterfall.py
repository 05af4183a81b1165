"""The waterfall: where a trace's prompt tokens went, from all of them down to the cached ones.

Per request of ``n`` prompt tokens, block size ``B`` and cap ``(n - 1) // B`` blocks (vLLM's
last-token rule), with ``any`` = the longest prefix it shares with anything stored before it in any
namespace and ``same`` = the same within its own namespace (:mod:`kvbench.explain.prefixes`):

=====================  ======================================================================
bar                    tokens
=====================  ======================================================================
new                    ``n - any``: never sent before; no cache could hit them
block floor            ``any - floor(any / B) * B``: the shared tail that does not fill a block
last token             ``floor(any / B) * B - min(floor(any / B), cap) * B``
salt                   ``min(floor(any / B), cap) * B - min(floor(same / B), cap) * B``
provider minimum       what is left, for a prompt shorter than the provider's minimum
caching off            what is left, for a run whose prefix caching was off (nothing hits)
capacity / TTL         what is left minus the replay's hit: evicted, or idle past the TTL
routing                a run behind a router: the replay's hit minus the hit the router's
                       model gives it on the replica it picked (:mod:`kvbench.route.expect`)
server                 the replay's (or the routed) hit minus what the server reported
hit                    the cached tokens (the server's report, or the replay's)
=====================  ======================================================================

Every bar is a difference of the same chain of numbers, so the bars of a request sum to ``n``
exactly, and the waterfall (the sum over requests) sums to the trace's prompt tokens. The server
bar is negative when a server reports more than the replayed cache allows; the routing bar when the
replicas' summed capacity kept what one cache evicted. The routing bar is shown for fleet runs only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

BARS: tuple[tuple[str, str], ...] = (
    ("new", "never sent before"),
    ("block_floor", "lost to partial blocks (block floor)"),
    ("last_token", "lost to the last-token rule"),
    ("salt", "lost to salt / namespace separation"),
    ("provider_minimum", "lost to the provider's minimum length"),
    ("cache_off", "lost to prefix caching being off"),
    ("capacity", "lost to capacity evictions"),
    ("ttl", "lost to TTL expiry"),
    ("routing", "lost to routing (the prefix was on another replica)"),
    ("server", "lost to the server (reported below the cache)"),
    ("hit", "hit"),
)
BAR_KEYS = tuple(key for key, _ in BARS)


@dataclass(frozen=True)
class Breakdown:
    """One request's tokens, bar by bar (:data:`BARS` keys -> tokens; they sum to ``prompt_tokens``)."""

    prompt_tokens: int
    tokens: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        total = sum(self.tokens.values())
        if total != self.prompt_tokens:
            raise ValueError(f"bars sum to {total}, not the {self.prompt_tokens} prompt tokens")


def breakdown(
    num_tokens: int,
    block_size: int,
    shared_any: int,
    shared_same: int,
    replay_hit: int | None,
    lost_to: str = "capacity",
    below_minimum: bool = False,
    reported: int | None = None,
    routed: int | None = None,
) -> Breakdown:
    """The bars of one request (module docstring). ``replay_hit``: the bounded replay's cached tokens
    (``None`` for a prompt below the provider minimum, which is never looked up); ``lost_to``:
    ``capacity``, ``ttl`` or ``cache_off``, the bar for ``ideal - replay_hit``; ``reported``: the
    server's count; ``routed``: the hit the router's model gives on the replica it picked."""
    cap = max(num_tokens - 1, 0) // block_size
    floored = shared_any // block_size * block_size
    capped = min(shared_any // block_size, cap) * block_size
    same = min(min(shared_same, shared_any) // block_size, cap) * block_size
    bars = dict.fromkeys(BAR_KEYS, 0)
    bars.update(
        new=num_tokens - shared_any,
        block_floor=shared_any - floored,
        last_token=floored - capped,
        salt=capped - same,
    )
    hit = 0 if below_minimum or replay_hit is None else replay_hit
    if below_minimum:
        bars["provider_minimum"] = same
    else:
        bars[lost_to] = same - hit
    if routed is not None and not below_minimum:
        bars["routing"], hit = hit - routed, routed
    if reported is not None:
        bars["server"], hit = hit - reported, reported
    bars["hit"] = hit
    return Breakdown(num_tokens, bars)


@dataclass(frozen=True)
class Waterfall:
    """The sum of every request's bars. ``total_tokens``: all prompt tokens; ``ideal_tokens``: what a
    never-evicting cache without blocks, caps or salts could hit (``total - new``)."""

    total_tokens: int
    tokens: dict[str, int]
    routed: bool = False  # a run behind a router: its rows show the routing bar

    @property
    def ideal_tokens(self) -> int:
        return self.total_tokens - self.tokens["new"]

    def share(self, key: str) -> float:
        """A bar as a share of all prompt tokens (0 for an empty trace)."""
        return self.tokens[key] / self.total_tokens if self.total_tokens else 0.0

    def rows(self) -> list[tuple[str, int, float, int]]:
        """``(label, tokens, share of all prompt tokens, tokens left after this bar)``, first row the
        total, then the ideal, then every loss, last the hit."""
        left = self.ideal_tokens
        rows = [
            ("prompt tokens", self.total_tokens, 1.0, self.total_tokens),
            (
                "an ideal cache could hit",
                self.ideal_tokens,
                1 - self.share("new") if self.total_tokens else 0.0,
                left,
            ),
        ]
        for key, label in BARS[1:-1]:
            if key == "routing" and not self.routed:
                continue
            left -= self.tokens[key]
            rows.append((label, self.tokens[key], self.share(key), left))
        rows.append(("hit", self.tokens["hit"], self.share("hit"), self.tokens["hit"]))
        return rows


def total(breakdowns: Sequence[Breakdown], routed: bool = False) -> Waterfall:
    """Sum the bars of every request; ``routed``: a run behind a router (its rows show routing)."""
    tokens = {key: sum(b.tokens[key] for b in breakdowns) for key in BAR_KEYS}
    return Waterfall(sum(b.prompt_tokens for b in breakdowns), tokens, routed)
