"""The fix of each loss (the table in :mod:`kvbench.explain.fixes`), each a function of the
:class:`~kvbench.explain.fixes.FixContext` that returns the changes it measured (none when its loss is
absent), and :func:`fix_list`, which runs them all and ranks the priced fixes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from kvbench.cache.base import CacheConfig, ReleaseOrder
from kvbench.explain import rewrite
from kvbench.explain.api import Explanation, replay_requests, unbounded_config
from kvbench.explain.capacity import bisected, capacity_targets, headline, kv_bytes, stored_curve
from kvbench.explain.fixes import Fix, FixContext, FixOptions, Measured, priced, rank
from kvbench.explain.ran import ReplayKind
from kvbench.memory.layout import format_bytes
from kvbench.request import Request
from kvbench.sim.curve import one_pass_refusal
from kvbench.sim.tiers import DEFAULT_BANDWIDTHS_BYTES_PER_S, Tier, TierPolicy, tier_split

HISTORY_FIXES = {  # content cause -> (rewrite, the change in words)
    "JSON key order": ("sort_json_keys", "serialize tool-call JSON with sorted keys"),
    "reasoning stripped": (
        "restore_reasoning",
        "resend the reasoning blocks of earlier replies byte for byte",
    ),
    "text re-rendered": ("render_all", "render every request with one chat template"),
    "re-tokenized": ("resend_tokens", "resend earlier replies as the token ids they were generated as"),
}


def _measured(
    ctx: FixContext,
    kind: str,
    change: str,
    cost: str,
    requests=None,
    config=None,
    without_minimum: bool = False,
    setting=None,
) -> Measured:
    after = ctx.replay(requests, config, without_minimum)
    return Measured(kind, change, cost, (after.requests, after.hit_tokens), setting=setting or {})


def _bar(ctx: FixContext, key: str) -> int:
    return ctx.explanation.waterfall.tokens[key]


def _capacity_targets(ctx: FixContext) -> list:
    """The capacity fix's sizes, by the replay of what ran: the exact curve or a bisection of kvbench's
    cache, or a bisection of the paged engine's pool (:func:`kvbench.explain.capacity.bisected`)."""
    if ctx.rules.replay is not ReplayKind.POOL:
        return capacity_targets(ctx.base.trace, ctx.config)
    roomy = (
        unbounded_config(ctx.requests, ctx.config).capacity_blocks + 1
    )  # + the block a request decodes into

    def hit(capacity: int) -> int:
        return ctx.replay(config=replace(ctx.config, capacity_blocks=capacity)).num_hit_tokens

    return bisected(hit, roomy)


def capacity_fix(ctx: FixContext) -> list[Measured]:
    if not _bar(ctx, "capacity"):
        return []
    targets = _capacity_targets(ctx)
    if not targets:
        return []
    block = ctx.config.block_size
    sizes = [
        {
            "share_of_ideal": t.share,
            "capacity_blocks": t.capacity_blocks,
            "hit_tokens": t.hit_tokens,
            **{f"{s.name}_bytes": kv_bytes(t.capacity_blocks, block, s) for s in ctx.options.model_shapes},
        }
        for t in targets
    ]
    chosen = headline(targets)
    weights = ", ".join(
        f"{format_bytes(kv_bytes(chosen.capacity_blocks, block, s))} for {s.name}"
        for s in ctx.options.model_shapes
    )
    change = f"raise the cache to >= {chosen.capacity_blocks:,} blocks" + (f" ({weights})" if weights else "")
    steps = "; ".join(f"{t.share:.0%} of the ideal at {t.capacity_blocks:,}" for t in targets)
    return [
        _measured(
            ctx,
            "capacity",
            change,
            f"{chosen.capacity_blocks - ctx.config.capacity_blocks:,} more blocks of KV memory ({steps})",
            config=replace(ctx.config, capacity_blocks=chosen.capacity_blocks),
            setting={"cache_size": chosen.capacity_blocks, "sizes": sizes},
        )
    ]


def host_tier_fix(ctx: FixContext) -> list[Measured]:
    """The capacity loss recovered by host memory instead of GPU memory: an inclusive (write-through)
    host KV tier of the capacity fix's size below the cache as it is (:mod:`kvbench.sim.tiers`, one pass;
    vLLM's CPU offloading connector), its hits loaded instead of recomputed. Only where the one pass
    is exact and no provider minimum applies, and for a trace: the one pass models no engine's tier
    (the paged engine's ``--host-tier`` differs by its pool), so a run would not reproduce it."""
    if (
        ctx.rules.is_run
        or not _bar(ctx, "capacity")
        or ctx.min_cacheable_tokens is not None
        or one_pass_refusal(ctx.config)
        or ctx.config.release_order is not ReleaseOrder.TAIL_FIRST
    ):
        return []
    targets = capacity_targets(ctx.base.trace, ctx.config)
    if not targets:
        return []
    host = headline(targets).capacity_blocks
    trace, block = ctx.base.trace, ctx.config.block_size
    tokens = np.array([p.num_tokens for p in trace.prompts], dtype=np.int64)
    split = tier_split(
        stored_curve(trace).distances,
        ctx.config.capacity_blocks,
        (Tier("host", host, DEFAULT_BANDWIDTHS_BYTES_PER_S["host"]),),
        TierPolicy.INCLUSIVE,
        block,
        tokens,
    )
    hits = split.hit_tokens.sum(axis=0)
    recovered = (int(hits.sum()) - int(ctx.base.hit_tokens.sum())) / _bar(ctx, "capacity")
    weights = ", ".join(
        f"{format_bytes(kv_bytes(host, block, s))} for {s.name}" for s in ctx.options.model_shapes
    )
    change = (
        f"keep the cache and add a host KV tier of >= {host:,} blocks"
        + (f" ({weights})" if weights else "")
        + f", write-through: it recovers {recovered:.0%} of the capacity loss"
    )
    cost = (
        f"host memory; {int(split.hit_tokens[1].sum()):,} prompt tokens loaded from it (at "
        f"{DEFAULT_BANDWIDTHS_BYTES_PER_S['host'] / 1e9:g} GB/s over PCIe) instead of recomputed"
    )
    return [
        Measured(
            "host tier",
            change,
            cost,
            (ctx.base.requests, hits),
            setting={"host_tier_blocks": host, "recovered_share_of_capacity_loss": recovered},
        )
    ]


def _causes(ctx: FixContext, prefix: str) -> list:
    return [
        c for item in ctx.explanation.requests for c in item.causes if c.kind.startswith(prefix) and c.tokens
    ]


def volatile_fix(ctx: FixContext) -> list[Measured]:
    found = _causes(ctx, "volatile value")
    moved = rewrite.move_volatile(ctx.requests, ctx.tokenizer) if found else None
    if moved is None:
        return []
    kinds = sorted({c.kind[len("volatile value (") : -1] for c in found})
    first = min(c.offset_tokens or 0 for c in found)
    removed = ctx.replay(rewrite.move_volatile(ctx.requests, ctx.tokenizer, remove=True))
    measured = _measured(
        ctx,
        "volatile value",
        f"move the {' / '.join(kinds)} (it differs from token {first:,} on) to the end of the prompt",
        "none (the moved value's own blocks are still recomputed)",
        moved,
        setting={"kinds": kinds, "hit_rate_if_removed": removed.hit_rate},
    )
    return [measured]


def history_fixes(ctx: FixContext) -> list[Measured]:
    fixes = []
    for kind, (name, change) in HISTORY_FIXES.items():
        if not _causes(ctx, kind):
            continue
        if name == "resend_tokens":
            earlier = {
                item.request.request_id: item.earlier_request_id
                for item in ctx.explanation.requests
                if item.causes and item.causes[0].kind == kind and item.earlier_request_id
            }
            rewritten = rewrite.resend_tokens(ctx.requests, ctx.tokenizer, earlier)
        else:
            rewritten = getattr(rewrite, name)(ctx.requests, ctx.tokenizer)
        if rewritten is not None:
            fixes.append(_measured(ctx, kind, change, "a client change, no server setting", rewritten))
    return fixes


def salt_fix(ctx: FixContext) -> list[Measured]:
    if not _bar(ctx, "salt"):
        return []
    salts = sorted({r.salt or "" for r in ctx.requests})
    unsalted = [replace(r, salt=None) for r in ctx.requests]
    return [
        _measured(
            ctx,
            "salt",
            f"share one cache namespace across the {len(salts):,} salts",
            "tenants then share cached prefixes: a timing side channel between them (the reason for "
            "cache_salt)",
            unsalted,
            setting={"salt": None},
        )
    ]


def block_size_fix(ctx: FixContext) -> list[Measured]:
    block = ctx.config.block_size
    if not _bar(ctx, "block_floor") or block == 1:
        return []
    best = None
    for smaller in sorted({max(block // 4, 1), max(block // 2, 1)}):
        config = replace(
            ctx.config, block_size=smaller, capacity_blocks=ctx.config.capacity_blocks * block // smaller
        )
        measured = _measured(
            ctx,
            "block size",
            f"use {smaller}-token blocks (from {block}, the same memory)",
            f"{block // smaller}x the block-table entries and block hashes per token",
            config=config,
            setting={"block_size": smaller, "cache_size": config.capacity_blocks},
        )
        if best is None or measured.after[1].sum() > best.after[1].sum():
            best = measured
    return [best]


def ttl_fix(ctx: FixContext) -> list[Measured]:
    if not _bar(ctx, "ttl"):
        return []
    return [
        _measured(
            ctx,
            "ttl",
            f"drop the TTL of {ctx.config.ttl_s:g} s (keep blocks until capacity evicts them)",
            "idle blocks hold memory until evicted (a provider's longer retention costs more per write)",
            config=replace(ctx.config, ttl_s=None),
            setting={"ttl": None},
        )
    ]


def provider_minimum_fix(ctx: FixContext) -> list[Measured]:
    if not _bar(ctx, "provider_minimum"):
        return []
    minimum = ctx.min_cacheable_tokens
    short = [r for r in ctx.requests if r.num_tokens < minimum]
    padding = sum(minimum - r.num_tokens for r in short)
    return [
        _measured(
            ctx,
            "provider minimum",
            f"pad the {len(short):,} prompts below {minimum:,} tokens up to it "
            "(measured as if the minimum did not apply)",
            f"{padding:,} padding tokens billed as input",
            without_minimum=True,
            setting={"min_cacheable_tokens": None, "padding_tokens": padding},
        )
    ]


def last_token_fix(ctx: FixContext) -> list[Measured]:
    if not _bar(ctx, "last_token"):
        return []
    return [
        Measured(
            "last token",
            "none: no setting recovers the last-token loss (vLLM and SGLang always "
            "recompute the last prompt token)",
            f"{_bar(ctx, 'last_token'):,} tokens stay lost",
            None,
        )
    ]


def routing_fix(ctx: FixContext) -> list[Measured]:
    replicas = ctx.options.num_replicas
    if replicas <= 1:
        return []
    from kvbench.route.api import compare_policies, needs_tokens, policies_for
    from kvbench.route.cluster import ClusterConfig, prepare_route_trace
    from kvbench.route.policies import PolicyName

    policies = policies_for(ctx.config)
    trace = prepare_route_trace(ctx.requests, ctx.config, keep_tokens=needs_tokens(policies))
    results = compare_policies(trace, ClusterConfig(replicas, ctx.config), policies)
    baseline = next(r for r in results if r.policy == PolicyName.ROUND_ROBIN.value)
    best = max(results, key=lambda r: r.token_hit_rate)
    ordered = sorted(ctx.requests, key=lambda r: r.arrival_s)
    imbalance = best.as_row()["requests_max_over_mean"]
    return [
        Measured(
            "routing",
            f"route with {best.policy} across the {replicas} replicas (instead of round-robin)",
            f"load imbalance {imbalance:.2f}x (busiest replica's requests / mean)",
            (ordered, best.run.cached_tokens),
            (ordered, baseline.run.cached_tokens),
            {
                "policy": best.policy,
                "replicas": replicas,
                "requests_max_over_mean": imbalance,
                **{f"{r.policy}_token_hit_rate": r.token_hit_rate for r in results},
            },
        )
    ]


def cache_on_fix(ctx: FixContext) -> list[Measured]:
    """Prefix caching off: turn it on, measured with room for every block (the same replay's rules
    with caching on: the paged engine's pool, else kvbench's cache)."""
    if not _bar(ctx, "cache_off"):
        return []
    kind = ReplayKind.POOL if ctx.rules.what == "paged engine" else ReplayKind.CACHE
    on = replace(ctx.rules, replay=kind, use_reported=False)
    roomy = unbounded_config(ctx.requests, ctx.config)
    roomy = replace(roomy, capacity_blocks=roomy.capacity_blocks + 1)
    after = replay_requests(ctx.requests, roomy, None, ctx.min_cacheable_tokens, on)
    return [
        Measured(
            "caching off",
            f"turn prefix caching on (kvbench: --cache on; vLLM: --enable-prefix-caching) with room for "
            f"{roomy.capacity_blocks:,} blocks of {roomy.block_size}",
            "KV memory for the cached blocks",
            (after.requests, after.hit_tokens),
            setting={"cache": "on", "cache_size": roomy.capacity_blocks},
        )
    ]


FIX_KINDS: tuple[Callable[[FixContext], list[Measured]], ...] = (
    cache_on_fix,
    capacity_fix,
    host_tier_fix,
    volatile_fix,
    history_fixes,
    salt_fix,
    block_size_fix,
    ttl_fix,
    provider_minimum_fix,
    last_token_fix,
    routing_fix,
)


def fix_list(
    explanation: Explanation,
    requests: Sequence[Request],
    tokenizer=None,
    min_cacheable_tokens: int | None = None,
    options: FixOptions = FixOptions(),
) -> list[Fix]:
    """Every fix for ``explanation``'s losses (of ``requests`` through ``explanation.config``), ranked."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    config: CacheConfig = explanation.config
    base = replay_requests(ordered, config, None, min_cacheable_tokens, explanation.rules)
    if explanation.rules.use_reported:  # no replay is the run's: the fixes start from what it hit
        base = replace(
            base, hit_tokens=np.array([e.hit_tokens for e in explanation.requests], dtype=np.int64)
        )
    ctx = FixContext(ordered, config, tokenizer, min_cacheable_tokens, base, explanation, options)
    return rank([priced(measured, ctx) for kind in FIX_KINDS for measured in kind(ctx)])
