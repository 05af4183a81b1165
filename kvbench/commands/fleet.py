"""``kvbench fleet``: N replicas behind a real router, one run per routing policy, per-replica truth."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from kvbench.commands.common import build, make_console, run_with_progress
from kvbench.commands.options import MaxTokens, Requests, Source
from kvbench.commands.signature import option
from kvbench.extras import missing_extra, needs_extra
from kvbench.fleet.experiment import FleetConfig, FleetOutcome, run_fleet
from kvbench.fleet.routers import ROUTERS, RouterKind
from kvbench.fleet.table import policy_rows
from kvbench.run.config import RunFlags
from kvbench.run.execute import RunInterrupted
from kvbench.run.scenario import parse_choices

_fleet = functools.partial(option, panel="Fleet")
_COLUMNS = (
    "policy",
    "replica",
    "requests",
    "prompt",
    "cached",
    "hit",
    "rows",
    "expected hit",
    "below",
    "as route",
)


def fleet(
    source: Source,
    router: _fleet(
        RouterKind, "The real router: sglang (sglang-router) or vllm (vllm-router)."
    ) = RouterKind.SGLANG,
    policy: _fleet(
        str, "The router's policies, comma-separated; each runs on fresh caches."
    ) = "cache_aware,round_robin",
    replicas: _fleet(int, "kvbench serve replicas to start.", min=1) = 3,
    worker_url: _fleet(
        list[str] | None, "A running server's root URL to use instead of starting replicas (repeatable)."
    ) = None,
    engine: _fleet(str, "The replicas' --engine: paged or copy.") = "paged",
    block_size: _fleet(int, "The replicas' --block-size, tokens.", min=1) = 16,
    cache_size: _fleet(str | None, "The replicas' --cache-size: blocks (4096) or bytes (2GiB).") = None,
    model: _fleet(Path | None, "A local checkpoint for the replicas (default: kvbench's model).") = None,
    requests: Requests = None,
    concurrency: option(int, "Requests in flight (1: expectations are exact).", min=1) = 1,
    max_tokens: MaxTokens = None,
    out: option(Path | None, "Output FOLDER (default results/fleet-NAME-TIME).") = None,
) -> None:
    """Start replicas and a real router, run the trace once per routing policy on fresh caches, and
    show per policy and replica what each served, hit and was expected to hit."""
    if engine not in ("paged", "copy"):
        raise typer.BadParameter(f"{engine!r}: choose paged or copy", param_hint="--engine")
    config = build(
        lambda: FleetConfig(
            source,
            router,
            tuple(parse_choices(policy, "--policy", ROUTERS[RouterKind(router)].policies)),
            out or Path("results") / f"fleet-{source.stem}-{time.strftime('%Y%m%d-%H%M%S')}",
            num_replicas=replicas,
            worker_urls=tuple(worker_url or ()),
            engine=engine,
            block_size=block_size,
            cache_size=cache_size,
            model=model,
            run=RunFlags(num_requests=requests, concurrency=concurrency, max_tokens=max_tokens),
        )
    )
    outcome = FleetOutcome(config, [])
    try:
        run_with_progress(lambda on_progress, on_status: _run(config, outcome, on_progress, on_status))
    except RunInterrupted:
        _show(outcome)
        raise
    _show(outcome)


def _run(config: FleetConfig, outcome: FleetOutcome, on_progress, on_status) -> FleetOutcome:
    from kvbench.run.api import run

    return run_fleet(config, on_status, lambda run_config: run(run_config, on_progress, on_status), outcome)


def _cell(value: Any, kind: str = "int") -> str:
    if value is None:
        return "-"
    if kind == "rate":
        return f"{value:.4f}"
    if kind == "pair":
        return f"{value[0]}/{value[1]}"
    return f"{int(value):,}"


def table(outcome: FleetOutcome) -> Table:
    """Policy x replica: each replica's own /metrics, then the fleet's line with the expectation."""
    result = Table(
        title=f"kvbench fleet: {outcome.config.router.value} router, {len(outcome.worker_urls)} replicas"
    )
    for column in _COLUMNS:
        result.add_column(
            column, justify="left" if column in ("policy", "replica") else "right", no_wrap=True
        )
    for run in outcome.runs:
        for line in policy_rows(run.policy, run.outcome):
            result.add_row(
                line.policy,
                escape(line.replica.removeprefix("http://")),
                _cell(line.requests),
                _cell(line.prompt_tokens),
                _cell(line.cached_tokens),
                _cell(line.hit_rate, "rate"),
                _cell(line.client_rows),
                _cell(line.expected_hit_rate, "rate") if line.is_fleet else "",
                _cell(line.below_expected) if line.is_fleet else "",
                _cell(line.agreement, "pair") if line.is_fleet else "",
                end_section=line.is_fleet,
            )
    result.caption = (
        "per replica: its own /metrics delta (rows: the client's rows naming it); fleet: the client's "
        "usage; expected: kvbench route's model of the policy; below: requests short of it by more than "
        "one block; as route: requests on the replica the model picked"
    )
    return result


def events_table(outcome: FleetOutcome) -> Table | None:
    """Policy x replica by the replicas' KV events: blocks held at the end; on the fleet's line the
    distinct blocks, those held by two or more replicas, and the prompt tokens another replica held
    beyond the one routed to. ``None`` when no run read events."""
    lines = [line for run in outcome.runs for line in policy_rows(run.policy, run.outcome)]
    if not any(line.blocks is not None for line in lines):
        return None
    result = Table(title="KV events: what each replica held")
    for column in ("policy", "replica", "blocks", "held twice+", "tokens elsewhere"):
        result.add_column(
            column, justify="left" if column in ("policy", "replica") else "right", no_wrap=True
        )
    for line in lines:
        result.add_row(
            line.policy,
            escape(line.replica.removeprefix("http://")),
            _cell(line.blocks),
            _cell(line.duplicated_blocks) if line.is_fleet else "",
            _cell(line.tokens_elsewhere) if line.is_fleet else "",
            end_section=line.is_fleet,
        )
    result.caption = (
        "blocks: held at the end (fleet: distinct, by content); held twice+: blocks two or more replicas "
        "hold; tokens elsewhere: prompt tokens a replica other than the one routed to held at send time"
    )
    return result


def _show(outcome: FleetOutcome) -> None:
    console, err = make_console(), make_console(stderr=True)
    if not outcome.runs:
        return
    for run in outcome.runs:
        verdict = (run.outcome.metadata.get("replica_metrics") or {}).get("verdict")
        if verdict:
            err.print(f"{run.policy}: {escape(verdict)}", soft_wrap=True)
    console.print(table(outcome))
    if (events := events_table(outcome)) is not None:
        console.print(events)
    png = _plot(outcome)
    where = f", {png}" if isinstance(png, Path) else f" (no PNG: {png})"
    console.print(escape(f"wrote {outcome.summary_path}{where}; rows per policy in {outcome.config.out_dir}"))


def _plot(outcome: FleetOutcome) -> Path | str:
    try:
        from kvbench.fleet.plots import plot_fleet
    except ImportError as exc:
        return missing_extra(exc) or needs_extra("plots")
    try:
        return plot_fleet(outcome, outcome.config.out_dir / "fleet.png")
    except ImportError as exc:
        return missing_extra(exc) or needs_extra("plots")


def register(app: typer.Typer) -> None:
    app.command("fleet")(fleet)
