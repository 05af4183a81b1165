"""``kvbench explain``: why a trace's prefix cache hits what it hits, request by request.

:func:`explain_requests` replays requests (arrival order) through a cache (the one replay loop,
:func:`kvbench.sim.replay.simulate`) and indexes every stored sequence
(:mod:`kvbench.explain.prefixes`), which gives each request's waterfall bars
(:mod:`kvbench.explain.waterfall`) and causes (:mod:`kvbench.explain.causes`).
:func:`explain_source` does it for a scenario or trace file, :func:`explain_results` for a run's
Parquet file (what the server reported, against what its cache config allows).

Generated tokens: unless ``config.prompt_only``, each request stores prompt + output - 1 tokens,
with the trace's own replies as outputs where the session's next turn shows them, else
placeholders of the request's output length (:mod:`kvbench.sim.outputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvbench.cache.base import CacheConfig, CacheKind
from kvbench.explain.causes import OWN_NEW_KINDS, Cause, Context, request_causes
from kvbench.explain.prefixes import PrefixIndex, SharedPrefix, stored_sequences
from kvbench.explain.ran import TRACE_RULES, ReplayKind, RunRules, pool_hits
from kvbench.explain.replay import ReplayDetails, replay_details
from kvbench.explain.waterfall import Breakdown, Waterfall, breakdown, total
from kvbench.request import Request
from kvbench.sim.outputs import Outputs, known_outputs, stored_blocks_of, trace_outputs
from kvbench.sim.replay import PreparedTrace, prompt_blocks_of, simulate


@dataclass(frozen=True)
class RequestExplanation:
    """One request: ``shared_tokens`` with ``earlier_request_id`` (the best earlier request in its
    namespace; the divergence is at token ``shared_tokens``), its bars and its causes."""

    request: Request
    shared_tokens: int
    earlier_request_id: str | None
    bars: Breakdown
    causes: list[Cause]

    @property
    def hit_tokens(self) -> int:
        return self.bars.tokens["hit"]

    @property
    def num_lost_tokens(self) -> int:
        """Tokens lost beyond the request's own new content: every bar but the hit, less the ``new``
        bar when its cause names nothing (:data:`~kvbench.explain.causes.OWN_NEW_KINDS`); a content
        cause (a timestamp, a reordered JSON) counts its new bar. 0: it lost only its own new tokens."""
        own = bool(self.causes) and self.causes[0].kind in OWN_NEW_KINDS
        return self.request.num_tokens - self.hit_tokens - (self.bars.tokens["new"] if own else 0)


@dataclass(frozen=True)
class Explanation:
    """Every request's explanation (replay order), their waterfall, and the rules of what ran
    (:class:`~kvbench.explain.ran.RunRules`: its notes say what the replay cannot know)."""

    name: str
    config: CacheConfig
    requests: list[RequestExplanation]
    waterfall: Waterfall
    rules: RunRules = TRACE_RULES


def explain_requests(
    requests: Sequence[Request],
    config: CacheConfig,
    tokenizer=None,
    outputs: Outputs | None = None,
    reported: Sequence[int | None] | None = None,
    min_cacheable_tokens: int | None = None,
    name: str = "",
    rules: RunRules = TRACE_RULES,
    routed: Sequence[int | None] | None = None,
) -> Explanation:
    """Explain ``requests`` (sorted by arrival, stable) through ``config``'s cache (module docstring).

    ``tokenizer`` (``decode``, optionally ``render_messages``) enables content causes; ``outputs``:
    per request, generated ids or ``None`` (default: the trace's replies); ``reported``: per request,
    the server's ``cached_tokens``; ``min_cacheable_tokens``: a provider's minimum prompt length
    (OpenAI and Anthropic: 1,024), below which a prompt is never cached; ``rules``: what ran
    (:mod:`kvbench.explain.ran`: the replay that gives the hits; with ``use_reported`` the reported
    hits, at most the request's ideal, stand in for it); ``routed``: per request of a run behind a
    router, the hit the router's model gives on the replica it picked (the routing bar).

    Raises:
        ValueError: ``outputs``, ``reported`` or ``routed`` differ in length from ``requests``.
    """
    order, ordered, reported = _in_arrival_order(requests, reported)
    routed = None if routed is None else _in_arrival_order(requests, routed)[2]
    given = None if config.prompt_only else _outputs(ordered, _run_outputs(outputs, rules, ordered), order)
    sequences = stored_sequences([r.token_ids for r in ordered], given or [None] * len(ordered))
    eligible = _eligible(ordered, min_cacheable_tokens)
    same, any_ = _shared_prefixes(ordered, sequences, config)
    details, replayed = _replay(ordered, given, eligible, config, rules)
    positions = sorted(replayed, key=replayed.get)
    ctx = Context(
        ordered,
        sequences,
        config.block_size,
        config.capacity_blocks,
        config.ttl_s,
        min_cacheable_tokens,
        tokenizer,
        routed is not None,
    )
    explained = []
    for p, request in enumerate(ordered):
        slot = replayed.get(p)
        mine = None if reported is None else reported[p]
        ideal_same = _ideal_same_tokens(request, same[p], any_[p], config.block_size)
        hit, lost_to = _hit_and_loss(rules, details, slot, ideal_same, mine)
        bars = breakdown(
            request.num_tokens,
            config.block_size,
            any_[p].tokens,
            same[p].tokens,
            hit,
            _lost_to(lost_to, same[p], eligible),
            not eligible[p],
            mine,
            None if routed is None else routed[p],
        )
        last_use = None if slot is None else details.last_use[slot]
        if last_use is not None:  # replay slot -> position among all requests
            last_use = replace(last_use, position=positions[last_use.position])
        causes = request_causes(ctx, p, bars, same[p], any_[p], last_use, mine)
        earlier = None if same[p].earlier is None else ordered[same[p].earlier].request_id
        explained.append(RequestExplanation(request, same[p].tokens, earlier, bars, causes))
    return Explanation(name, config, explained, total([e.bars for e in explained], routed is not None), rules)


@dataclass(frozen=True)
class Replayed:
    """The explain replay of some requests (arrival order): ``hit_tokens`` per request (0 for a prompt
    below the provider minimum, never looked up) and the outputs each request stored."""

    requests: list[Request]
    hit_tokens: np.ndarray
    outputs: list | None
    trace: PreparedTrace  # the replayed (eligible) requests, :func:`eligible_trace`

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)

    @property
    def num_hit_tokens(self) -> int:
        return int(self.hit_tokens.sum())

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens / prompt tokens (0 for no tokens)."""
        return self.num_hit_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0


def replay_requests(
    requests: Sequence[Request],
    config: CacheConfig,
    outputs: Outputs | None = None,
    min_cacheable_tokens: int | None = None,
    rules: RunRules = TRACE_RULES,
) -> Replayed:
    """The bounded replay :func:`explain_requests` takes its hits from, without the causes: what a
    fix (:mod:`kvbench.explain.fixes`) is measured with, by ``rules``' replay (never the reported
    hits). Same arguments and errors."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    ordered = [requests[i] for i in order]
    given = None if config.prompt_only else _outputs(ordered, _run_outputs(outputs, rules, ordered), order)
    eligible = _eligible(ordered, min_cacheable_tokens)
    trace, positions = eligible_trace(ordered, given, eligible, config)
    hits = np.zeros(len(ordered), dtype=np.int64)
    hits[positions] = replay_hits(trace, [ordered[p] for p in positions], config, rules)
    return Replayed(ordered, hits, given, trace)


def replay_hits(
    trace: PreparedTrace, requests: Sequence[Request], config: CacheConfig, rules: RunRules
) -> np.ndarray:
    """Per replayed request (``trace``'s, which are ``requests``), its hit tokens by ``rules``' replay:
    kvbench's cache, the paged engine's pool (:func:`kvbench.explain.ran.pool_hits`) or none."""
    if rules.replay is ReplayKind.POOL:
        return pool_hits(requests, config)
    if rules.replay is ReplayKind.OFF:
        return np.zeros(len(requests), dtype=np.int64)
    return simulate(trace, config).cached_tokens_per_request


def _run_outputs(outputs: Outputs | None, rules: RunRules, ordered: Sequence[Request]) -> Outputs | None:
    """A run's engine generated its own tokens, which no later prompt contains: placeholders (as the
    run's prediction), not the trace's replies, unless outputs are given."""
    return [None] * len(ordered) if outputs is None and rules.is_run else outputs


def _in_arrival_order(
    requests: Sequence[Request], reported: Sequence[int | None] | None
) -> tuple[list[int], list[Request], list[int | None] | None]:
    """The arrival order (positions in ``requests``, stable), the requests in it and ``reported`` in it.

    Raises:
        ValueError: ``reported`` differs in length from ``requests``.
    """
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    ordered = [requests[i] for i in order]
    if reported is not None:
        if len(reported) != len(requests):
            raise ValueError(f"got {len(reported)} reported counts for {len(requests)} requests")
        reported = [reported[i] for i in order]
    return order, ordered, reported


def _ideal_same_tokens(request: Request, same: SharedPrefix, any_: SharedPrefix, block_size: int) -> int:
    """The hit ``request`` would get from its namespace with nothing evicted: the prefix it shares
    there (at most the one shared in any), in whole blocks, never its prompt's last token. A TTL
    replay's hit below it means the prefix expired."""
    return (
        min(
            min(same.tokens, any_.tokens) // block_size,
            max(request.num_tokens - 1, 0) // block_size,
        )
        * block_size
    )


def _eligible(ordered: Sequence[Request], min_cacheable_tokens: int | None) -> list[bool]:
    return [min_cacheable_tokens is None or r.num_tokens >= min_cacheable_tokens for r in ordered]


def _hit_and_loss(
    rules: RunRules, details: ReplayDetails, slot: int | None, ideal_same: int, reported: int | None
) -> tuple[int | None, str | None]:
    """A request's replayed hit (``None``: never looked up) and the bar its misses go to when known
    here (``ttl``, ``cache_off``; ``None``: :func:`_lost_to` decides). With ``rules.use_reported``
    the reported hit, at most the ideal, stands in for the replay's."""
    if slot is None:
        return None, None
    hit = int(details.hit_tokens[slot])
    if rules.use_reported and reported is not None:
        hit = min(reported, ideal_same)
    if rules.replay is ReplayKind.OFF:
        return hit, "cache_off"
    ttl = details.ttl_hit_tokens
    return hit, "ttl" if ttl is not None and int(ttl[slot]) < ideal_same else None


def _lost_to(known: str | None, same: SharedPrefix, eligible: Sequence[bool]) -> str:
    """The bar for what the replay missed: ``known`` (TTL, caching off), a shared prefix only a
    too-short prompt had (the provider never cached it), else capacity."""
    if known:
        return known
    return "provider_minimum" if same.earlier is not None and not eligible[same.earlier] else "capacity"


def _outputs(ordered: Sequence[Request], outputs: Outputs | None, order: list[int]) -> list:
    if outputs is not None:
        if len(outputs) != len(ordered):
            raise ValueError(f"got {len(outputs)} outputs for {len(ordered)} requests")
        return known_outputs(ordered, [outputs[i] for i in order])
    return known_outputs(ordered, trace_outputs(ordered))


def _shared_prefixes(
    ordered: Sequence[Request], sequences: Sequence[np.ndarray], config: CacheConfig
) -> tuple[list[SharedPrefix], list[SharedPrefix]]:
    """Per request, the longest prefix shared with an earlier stored sequence: in its namespace, in any."""
    same_index, any_index = (
        PrefixIndex(config.block_size, config.hash),
        PrefixIndex(config.block_size, config.hash),
    )
    same, any_ = [], []
    for position, request in enumerate(ordered):
        prompt = np.asarray(request.token_ids, dtype=np.int64)
        same.append(same_index.longest(prompt, request.salt or ""))
        any_.append(any_index.longest(prompt, ""))
        same_index.add(position, sequences[position], request.salt or "")  # all: no provider minimum
        any_index.add(position, sequences[position], "")
    return same, any_


def _replay(
    ordered: Sequence[Request],
    outputs: list | None,
    eligible: Sequence[bool],
    config: CacheConfig,
    rules: RunRules,
):
    """The bounded replay of the eligible requests; returns the details and position -> replay slot.
    Only kvbench's cache replay knows when a missing block was last used."""
    trace, positions = eligible_trace(ordered, outputs, eligible, config)
    if rules.replay is ReplayKind.CACHE:
        details = replay_details(trace.prompts, trace.stored, trace.arrivals_s, config)
    else:
        hits = replay_hits(trace, [ordered[p] for p in positions], config, rules)
        details = ReplayDetails(hits, None, [None] * len(positions))
    return details, {p: slot for slot, p in enumerate(positions)}


def eligible_trace(
    ordered: Sequence[Request], outputs: list | None, eligible: Sequence[bool], config: CacheConfig
) -> tuple[PreparedTrace, list[int]]:
    """The trace the explain replay runs (the eligible requests, in the order given, hashed for
    ``config``; ``stored`` is the prompts' blocks when ``outputs`` is ``None``) and each replayed
    request's position in ``ordered``."""
    positions = [p for p, ok in enumerate(eligible) if ok]
    chosen = [ordered[p] for p in positions]
    keep = config.kind is CacheKind.RADIX or config.verify_tokens
    prompts = prompt_blocks_of(chosen, config.block_size, config.hash, keep_tokens=keep)
    stored = (
        prompts
        if outputs is None
        else stored_blocks_of(chosen, [outputs[p] for p in positions], config.block_size, config.hash, keep)
    )
    arrivals = np.array([r.arrival_s for r in chosen], dtype=np.float64)
    return PreparedTrace(prompts, arrivals, config.block_size, stored), positions


def unbounded_config(requests: Sequence[Request], config: CacheConfig) -> CacheConfig:
    """``config`` with room for every full block the requests could store (prompt + output)."""
    lengths = sum((r.num_tokens + (r.output_tokens or r.max_tokens)) // config.block_size for r in requests)
    return replace(config, capacity_blocks=max(lengths, 1))
