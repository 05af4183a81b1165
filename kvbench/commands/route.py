"""``kvbench route``: N simulated replicas, each with its own prefix cache, behind one routing policy."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.table import Table

from kvbench.commands.common import Heartbeat, build, make_console, sigterm_as_interrupt, status_printer
from kvbench.commands.options import CacheKindOption, Requests, Source
from kvbench.commands.signature import in_panel, option
from kvbench.errors import InputError, Interrupted
from kvbench.results.parquet import check_output_path, write_rows
from kvbench.route.api import PREFIX_TOKENS, RouterOptions, compare_policies, needs_tokens, policies_for
from kvbench.route.cache_aware import CacheAwareConfig
from kvbench.route.cluster import ClusterConfig, prepare_route_trace
from kvbench.route.plots import plot_load_over_time, plot_policies
from kvbench.route.policies import PolicyName
from kvbench.route.result import PolicyResult
from kvbench.route.service import ServiceModel, fit_service_model
from kvbench.run.config import CacheFlags
from kvbench.run.scenario import parse_choices
from kvbench.run.setup import cache_config
from kvbench.run.source import limit_requests, load_source
from kvbench.words import counted

_COLUMNS = (
    "policy",
    "hit",
    "replica hit",
    "copies",
    "req imb",
    "busy imb",
    "queue p50",
    "queue p99",
    "TTFT p50",
    "TTFT p99",
)


def _table(title: str, results: list[PolicyResult]) -> Table:
    table = Table(title=title)
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column == "policy" else "right", no_wrap=True)
    for result in results:
        row = result.as_row()
        rates = [rate for rate, n in zip(row["replica_token_hit_rates"], row["replica_requests"]) if n] or [
            0.0
        ]
        copies = "-" if row["prefix_copies_mean"] is None else f"{row['prefix_copies_mean']:.1f}"
        table.add_row(
            result.policy,
            f"{row['token_hit_rate']:.4f}",
            f"{min(rates):.2f}..{max(rates):.2f}",
            copies,
            f"{row['requests_max_over_mean']:.2f}",
            f"{row['busy_max_over_mean']:.2f}",
            f"{row['median_queue_ms']:,.0f}",
            f"{row['p99_queue_ms']:,.0f}",
            f"{row['median_ttft_ms']:,.0f}",
            f"{row['p99_ttft_ms']:,.0f}",
        )
    table.caption = (
        "hit = cached / prompt tokens (replica hit: min..max over replicas that served requests); "
        "copies = replicas holding each of the most shared prefixes (mean); imb = busiest replica / "
        "mean, of requests and of busy time (1 = even); queue and TTFT in ms from the service model"
    )
    return table


def _policies(text: str, cache_cfg) -> list[PolicyName]:
    """The policies ``--policy`` names; ``all`` is every one the replicas' cache allows (``kv_aware``
    reads block events, which the radix cache does not publish: named alone, it is one line)."""
    names = [p.value for p in PolicyName]
    if text.strip() == "all":
        return policies_for(cache_cfg)
    chosen = [PolicyName(p) for p in parse_choices(text, "--policy", names + ["all"]) if p != "all"]
    refused = [p.value for p in chosen if p not in policies_for(cache_cfg)]
    if refused:
        raise InputError(
            f"--policy {', '.join(refused)}: reads each replica's cache through its block events, which "
            f"the {cache_cfg.kind.value} cache does not publish (use --cache hash)"
        )
    return chosen or policies_for(cache_cfg)


def _service(
    fit: Path | None, base_ms: float | None, per_token_ms: float | None, decode_ms: float | None
) -> ServiceModel:
    model = fit_service_model(fit) if fit is not None else ServiceModel()
    given = {
        "prefill_base_ms": base_ms,
        "prefill_ms_per_token": per_token_ms,
        "decode_ms_per_token": decode_ms,
    }
    for flag, value in zip(
        ("--prefill-base-ms", "--prefill-ms-per-token", "--decode-ms-per-token"), given.values()
    ):
        if value is not None and not value >= 0:
            raise InputError(f"{flag}: {value} is not a non-negative number of milliseconds")
    return ServiceModel(**{**model.as_dict(), **{k: v for k, v in given.items() if v is not None}})


_FLAGS = {
    "prefix_tokens": "--prefix-tokens",
    "epsilon": "--epsilon",
    "cache_threshold": "--cache-threshold",
    "balance_abs_threshold": "--balance-abs-threshold",
    "balance_rel_threshold": "--balance-rel-threshold",
    "eviction_interval_s": "--eviction-interval",
    "max_tree_size_tokens": "--max-tree-size",
}


def _options(factory) -> RouterOptions:
    """``factory()``; a ``ValueError`` naming a field becomes one line naming its flag."""
    try:
        return factory()
    except ValueError as exc:
        field, _, problem = str(exc).partition(" ")
        raise InputError(f"{_FLAGS.get(field, field)}: {problem}") from None


def _compare(
    trace, config: ClusterConfig, policies, options: RouterOptions, on_policy: Callable[[PolicyResult], None]
) -> list[PolicyResult]:
    """:func:`compare_policies` under a spinner, ``on_policy`` after each policy; outside a terminal, a
    status line as each policy finishes and a :class:`Heartbeat` meanwhile."""
    err = make_console(stderr=True)
    say = status_printer(err)
    finished: list[str] = []
    with err.status("routing"), Heartbeat(err) as heartbeat:

        def done(result: PolicyResult) -> None:
            on_policy(result)
            finished.append(result.policy)
            heartbeat.set(f"{len(finished)} of {len(policies)} policies routed")
            if not err.is_terminal:
                say(f"routed: {result.policy} ({len(finished)} of {len(policies)} policies)")

        return compare_policies(trace, config, policies, options, progress=done)


# One option in each of route's --help panels (see signature.option).
_in_replicas = functools.partial(option, panel="Replicas and cache")
_in_service_model = functools.partial(option, panel="Service model")
_in_policies = functools.partial(option, panel="Policy settings")


def route(
    source: Source,
    replicas: _in_replicas(int, "Replicas behind the router.") = 8,
    policy: _in_replicas(
        str,
        "round-robin, random, least-loaded, session, prefix-hash, cache-aware, sglang_cache_aware, "
        "vllm_cache_aware, consistent_hash, power_of_two, kv_aware, a comma list, or all.",
    ) = "all",
    capacity: _in_replicas(
        int | None,
        "Cache blocks per replica (default: the middle of the source's [sim] sizes).",
    ) = None,
    cache: in_panel("Replicas and cache", CacheKindOption) = None,
    ttl: _in_replicas(float | None, "Expire blocks idle longer than this (trace seconds).") = None,
    requests: in_panel("Replicas and cache", Requests) = None,
    fit: _in_service_model(Path | None, "Fit the service model from a kvbench run results file.") = None,
    prefill_base_ms: _in_service_model(float | None, "Prefill fixed cost a, ms [10].") = None,
    prefill_ms_per_token: _in_service_model(
        float | None, "Prefill cost b per uncached token, ms [0.1]."
    ) = None,
    decode_ms_per_token: _in_service_model(float | None, "Decode time per output token, ms [20].") = None,
    prefix_tokens: _in_policies(int, "prefix-hash: hash the blocks of the first N tokens.") = PREFIX_TOKENS,
    epsilon: _in_policies(float, "prefix-hash: load bound ceil((1+eps) x mean).") = 0.25,
    cache_threshold: _in_policies(float, "cache-aware: match rate above which to follow the match.") = 0.3,
    balance_abs_threshold: _in_policies(int, "cache-aware: imbalance when max-min > this.") = 64,
    balance_rel_threshold: _in_policies(float, "cache-aware: ... and max > min x this.") = 1.5,
    eviction_interval: _in_policies(float, "cache-aware: tree eviction period, trace s.") = 120.0,
    max_tree_size: _in_policies(int, "cache-aware: tokens per replica's tree.") = 2**26,
    seed: _in_replicas(int, "Seed of the random and power_of_two policies.") = 0,
    out: _in_replicas(
        Path | None,
        "Parquet, one row per policy (default results/route-NAME-TIME.parquet); the PNGs go beside it.",
    ) = None,
) -> None:
    """Route one trace over N simulated replicas, each with its own prefix cache, under each policy:
    hit rates, copies of popular prefixes, load imbalance, queue and TTFT percentiles."""
    if replicas < 1:
        raise InputError(f"--replicas: {replicas} is not a positive number of replicas")
    if requests is not None and requests <= 0:
        raise InputError(f"--requests: {requests} is not a positive number of requests")
    if capacity is not None and capacity <= 0:
        raise InputError(f"--capacity: {capacity} is not a positive number of blocks")
    if out is not None:
        check_output_path(out)
    service = _service(fit, prefill_base_ms, prefill_ms_per_token, decode_ms_per_token)
    options = _options(
        lambda: RouterOptions(
            prefix_tokens,
            epsilon,
            seed,
            CacheAwareConfig(
                cache_threshold,
                balance_abs_threshold,
                balance_rel_threshold,
                eviction_interval,
                max_tree_size,
            ),
        )
    )
    loaded = load_source(source, limit=requests)
    sizes = sorted(loaded.sim.sizes)
    cache_cfg = cache_config(
        loaded.cache,
        CacheFlags(cache_kind=cache, ttl=ttl),
        capacity or sizes[len(sizes) // 2],
        loaded.block_size,
    )
    policies = _policies(policy, cache_cfg)
    trace = prepare_route_trace(
        limit_requests(loaded.requests, requests), cache_cfg, keep_tokens=needs_tokens(policies)
    )
    config = build(lambda: ClusterConfig(replicas, cache_cfg, service))
    out = out or Path("results") / f"route-{loaded.name}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
    metadata = {
        "command": "route",
        "source": loaded.description,
        "service": service.as_dict(),
        "cache_capacity_blocks": cache_cfg.capacity_blocks,
        "cache_kind": cache_cfg.kind.value,
        "block_size": cache_cfg.block_size,
        "num_replicas": replicas,
    }
    results = _route_all(trace, config, policies, options, out, metadata)
    title = (
        f"kvbench route: {loaded.name}, {counted(trace.num_requests, 'request')}, {replicas} replicas x "
        f"{cache_cfg.capacity_blocks:,} blocks of {cache_cfg.block_size} tokens ({cache_cfg.kind.value})"
    )
    make_console().print(_table(title, results))
    _write(out, results, title, metadata)


def _rows_file(out: Path, results: list[PolicyResult], metadata: dict, complete: bool) -> Path:
    """The Parquet file: one row per policy done; ``complete: false`` names the policies done."""
    footer = {
        **metadata,
        "decisions": {r.policy: r.decisions for r in results if r.decisions},
        "complete": complete,
    }
    if not complete:
        footer["policies_finished"] = [r.policy for r in results]
    return write_rows(out, [r.as_row() for r in results], footer)


def _route_all(
    trace,
    config: ClusterConfig,
    policies: list[PolicyName],
    options: RouterOptions,
    out: Path,
    metadata: dict,
) -> list[PolicyResult]:
    """:func:`compare_policies`, checkpointing the policies done to ``out`` after each (``complete:
    false``: a SIGKILL keeps them). Ctrl-C or SIGTERM: they are written and :class:`Interrupted` says
    which policy was cut (its partial simulation is no row: a row sums a whole trace)."""
    done: list[PolicyResult] = []

    def checkpoint(result: PolicyResult) -> None:
        done.append(result)
        if len(done) < len(policies):
            _rows_file(out, done, metadata, complete=False)

    with sigterm_as_interrupt():
        try:
            return _compare(trace, config, policies, options, checkpoint)
        except KeyboardInterrupt:
            cut = policies[len(done)].value if len(done) < len(policies) else None
            kept = (
                f"kept {len(done)} finished policies ({', '.join(r.policy for r in done)}) in "
                f"{_rows_file(out, done, {**metadata, 'policy_partial': cut}, complete=False)}"
                if done
                else "no policy had finished; nothing written"
            )
            raise Interrupted(f"kvbench route: interrupted during policy {cut}; {kept}") from None


def _write(out: Path, results: list[PolicyResult], title: str, metadata: dict) -> None:
    """The Parquet (one row per policy) and the two PNGs beside it."""
    console = make_console()
    _rows_file(out, results, metadata, complete=True)
    stem = out.with_suffix("")
    for png in (
        plot_policies(results, stem.with_name(stem.name + "-policies.png"), title),
        plot_load_over_time(results, stem.with_name(stem.name + "-load.png"), title),
    ):
        console.print(f"  {png}")
    console.print(f"wrote {len(results)} rows to {out}")


def register(app: typer.Typer) -> None:
    app.command("route")(route)
