"""Did the server's prefix cache do what the trace allows? Expected vs reported vs ``/metrics``.

Three opinions on one run's hit rate:

1. **Expected** (``expected_cached_tokens``, per request): the simulator replays the trace, in trace
   order, through a hash cache of the server's block size: unbounded (the ideal) or of a given number
   of blocks. At concurrency 1 on a server with that block size and enough memory, a correct cache
   reports exactly this.
2. **Reported**: ``usage.prompt_tokens_details.cached_tokens`` of each response.
3. **Metrics**: the delta of the server's prefix-cache counters
   (:func:`kvbench.backends.openai.metrics.parse_prefix_cache_counters`)
   between scrapes before and after the run. They count every request the server saw in between,
   other users' included, and count in the server's own tokens.

Per request, two bounds:

* **possible** (order-free): the longest block-aligned prefix (last-token cap applied) the request
  shares with any *other* request of the run that was sent before it ended. A cache that reports
  more than this served tokens the run never sent (with cache hygiene on): a correctness red flag.
* **expected**: reported below it by more than one block means evictions, routing to another
  replica, a prefix that varies, or requests served in another order than the trace's (concurrency).

Reported above expected but within possible happens when requests overlap and the server served
them in another order than the trace's; it is counted, not flagged.

Checked on every successful request, whether it reported ``cached_tokens`` or not:

* **impossible** ``cached_tokens`` (negative, or more than the response's own ``prompt_tokens``):
  flagged and kept out of every rate (the row keeps the value the server sent);
* the server's ``prompt_tokens`` against the local tokenizer's count (a different tokenizer or chat
  template on the server: then expected and reported hits are in different units; the expected rate
  divides by the local count, so it stays in its own units);
* with ``ignore_eos``, an output shorter than ``max_tokens`` (the server ignored ``ignore_eos`` or
  stopped early): flagged, since every TPOT and decode-rate figure assumes the full budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvbench.backends.openai.metrics import PrefixCacheCounters
from kvbench.cache.base import CacheConfig
from kvbench.cache.block_hash import PromptBlocks
from kvbench.request import Request, RequestRecord
from kvbench.results.rows import ResultRow
from kvbench.results.summary import plausible_cached
from kvbench.sim.bounds import possible_cached_tokens
from kvbench.sim.predict import Unbounded, expected_cached_tokens
from kvbench.sim.replay import prompt_blocks_of

MAX_LISTED = 10  # requests listed per flag in the summary


@dataclass(frozen=True, eq=False)
class Expectations:
    """Per request (same order as the requests): its blocks and the ideal cache's cached tokens;
    ``fleet`` names the router model the expectation came from (``None``: one cache)."""

    prompts: list[PromptBlocks]
    expected_cached_tokens: list[int]
    block_size: int
    capacity_blocks: int | None  # None: unbounded
    fleet: str | None = None  # e.g. "round-robin over 3 replicas"


def expect(requests: Sequence[Request], block_size: int, capacity_blocks: int | None = None) -> Expectations:
    """The predictor's cached tokens per request (:func:`kvbench.sim.predict.expected_cached_tokens`)
    for a hash cache of ``block_size``-token blocks holding ``capacity_blocks`` (``None``: never
    evicting), in request order, plus each request's blocks for the order-free bound."""
    cache = Unbounded(block_size) if capacity_blocks is None else CacheConfig(capacity_blocks, block_size)
    return Expectations(
        prompt_blocks_of(requests, block_size),
        expected_cached_tokens(requests, cache),
        block_size,
        capacity_blocks,
    )


@dataclass(frozen=True)
class Flagged:
    """One request whose reported cached tokens stand out."""

    request_id: str
    prompt_tokens: int
    reported_tokens: int
    expected_tokens: int
    possible_tokens: int | None


@dataclass(frozen=True)
class Reconciliation:
    """The three opinions over one run's successful requests (warm-up included, so that the
    ``/metrics`` delta covers the same traffic). Rates are fractions; ``None`` = not available."""

    block_size: int
    capacity_blocks: int | None
    num_compared: int
    num_unreported: int
    reported_hit_rate: float | None
    expected_hit_rate: float | None
    metrics_hit_rate: float | None
    metrics_queries_tokens: float | None
    metrics_hits_tokens: float | None
    metrics_family: str | None
    over_possible: tuple[Flagged, ...]
    num_above_expected: int
    below_expected: tuple[Flagged, ...]
    num_prompt_token_mismatches: int
    impossible: tuple[Flagged, ...] = ()
    short_outputs: tuple[str, ...] = ()  # request ids (ignore_eos runs only)
    metrics_scope: str | None = None  # None: the delta covers every endpoint; else what it covers
    # set when the /metrics delta counts fewer prompt tokens than the client saw (a router forwarding
    # /metrics to one worker): then it is no rate of this run's traffic and metrics_hit_rate is None
    metrics_partial: str | None = None
    fleet: str | None = None  # the router model behind the expectation (None: one cache)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _metrics_delta(
    before: PrefixCacheCounters | None, after: PrefixCacheCounters | None
) -> tuple[float | None, float | None, float | None, str | None]:
    delta = after.since(before) if after is not None else None
    if delta is None:
        return None, None, None, None
    queries, hits = delta.queries_tokens, delta.hits_tokens
    rate = hits / queries if queries > 0 and math.isfinite(queries) else None
    return rate, queries, hits, delta.family


def reconcile(
    rows: Sequence[ResultRow],
    requests: Sequence[Request],
    expectations: Expectations,
    records: Sequence[RequestRecord | None],
    before: PrefixCacheCounters | None = None,
    after: PrefixCacheCounters | None = None,
    ignore_eos: bool = False,
) -> Reconciliation:
    """Compare each ok row's ``cached_prompt_tokens`` with its expectation and bound, and run the
    per-request checks of the module docstring (``ignore_eos``: the run asked for full outputs).

    ``requests``, ``expectations`` and ``records`` (``None`` for a request never sent) are in the
    same order; rows are matched by ``request_index``.
    """
    position = {request.index: i for i, request in enumerate(requests)}
    windows = [None if r is None or r.sent_s is None else (r.sent_s, r.ended_s) for r in records]
    possible = possible_cached_tokens(expectations.prompts, windows)
    block_size = expectations.block_size
    ok = [row for row in rows if row.status == "ok" and row.request_index in position]
    reported_rows = [row for row in ok if row.cached_prompt_tokens is not None]
    compared = [row for row in reported_rows if plausible_cached(row)]
    impossible = tuple(
        _flagged(row, expectations, possible, position) for row in reported_rows if not plausible_cached(row)
    )
    over, below, num_above = [], [], 0
    reported = expected = prompt = local_prompt = 0
    for row in compared:
        i = position[row.request_index]
        flagged = _flagged(row, expectations, possible, position)
        reported += flagged.reported_tokens
        expected += flagged.expected_tokens
        prompt += row.prompt_tokens
        local_prompt += requests[i].prompt_tokens
        if possible[i] is not None and flagged.reported_tokens > possible[i]:
            over.append(flagged)
        elif flagged.reported_tokens > flagged.expected_tokens:
            num_above += 1
        elif flagged.expected_tokens - flagged.reported_tokens > block_size:
            below.append(flagged)
    mismatches = sum(row.prompt_tokens != requests[position[row.request_index]].prompt_tokens for row in ok)
    short = tuple(
        row.request_id
        for row in ok
        if ignore_eos and row.max_tokens is not None and (row.output_tokens or 0) < row.max_tokens
    )
    rate, queries, hits, family = _metrics_delta(before, after)
    partial = _partial_metrics(queries, sum(row.prompt_tokens or 0 for row in ok))
    return Reconciliation(
        block_size=block_size,
        capacity_blocks=expectations.capacity_blocks,
        num_compared=len(compared),
        num_unreported=len(ok) - len(reported_rows),
        reported_hit_rate=reported / prompt if prompt else None,
        expected_hit_rate=expected / local_prompt if local_prompt else None,
        metrics_hit_rate=None if partial else rate,
        metrics_queries_tokens=queries,
        metrics_hits_tokens=hits,
        metrics_family=family,
        over_possible=tuple(over),
        num_above_expected=num_above,
        below_expected=tuple(below),
        num_prompt_token_mismatches=mismatches,
        impossible=impossible,
        short_outputs=short,
        metrics_partial=partial,
        fleet=expectations.fleet,
    )


def _partial_metrics(queries: float | None, client_prompt_tokens: int) -> str | None:
    """One line when the ``/metrics`` delta counted fewer prompt tokens than the client's ok responses
    (every server kvbench reads counts each prompt token of a finished request once), else ``None``.
    Behind vllm-router 0.1.17 each scrape is forwarded to one worker: the delta mixes workers."""
    if queries is None or queries >= client_prompt_tokens:
        return None
    return (
        f"/metrics counted {queries:,.0f} prompt tokens, the client saw {client_prompt_tokens:,}: it "
        "covers part of the traffic (a router forwarding /metrics to one worker?), not this run's; "
        "use --replica-metrics"
    )


def _flagged(
    row: ResultRow,
    expectations: Expectations,
    possible: Sequence[int | None],
    position: Mapping[int, int],
) -> Flagged:
    i = position[row.request_index]
    return Flagged(
        row.request_id,
        row.prompt_tokens,
        row.cached_prompt_tokens,
        expectations.expected_cached_tokens[i],
        possible[i],
    )
