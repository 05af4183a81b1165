"""The tables ``kvbench run`` prints: the summary, vLLM's latency statistics, the HTTP backend's checks
of the cached tokens servers report, and a routed run's table per endpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from kvbench.results.engine_rows import verify_logit_rows
from kvbench.results.memory_rows import kv_memory_rows
from kvbench.results.replicas import replica_rows
from kvbench.results.rows import ResultRow
from kvbench.results.summary import RunSummary
from kvbench.results.what_ran import what_ran
from kvbench.results.writer import error_kinds, num_multi_token_chunks
from kvbench.words import counted

if TYPE_CHECKING:
    from kvbench.backends.openai.reconcile import Flagged, Reconciliation


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def summary_table(name: str, run: dict[str, Any], summary: RunSummary) -> Table:
    """The run's summary as a two-column table (metric, value), titled by :func:`summary_title`."""
    table = Table(title=escape(summary_title(name, run)))
    table.add_column("metric")
    table.add_column("value", justify="right")
    hit = "-" if summary.token_hit_rate is None else f"{summary.token_hit_rate:.4f}"
    expected = "-" if summary.expected_hit_rate is None else f"{summary.expected_hit_rate:.4f}"
    rows = [
        (
            "requests (measured / warm-up / errors)",
            f"{summary.num_requests} / {summary.num_warmup} / {summary.num_errors}",
        ),
        (
            "prompt tokens / cached",
            f"{summary.prompt_tokens:,} / "
            + ("-" if summary.token_hit_rate is None else f"{summary.cached_prompt_tokens:,}"),
        ),
        ("token hit rate (expected by the simulator)", f"{hit} ({expected})"),
        ("TTFT cold first request (ms)", _ms(summary.cold_ttft_ms)),
        (
            "TTFT p50 / p90 / p99 (ms)",
            f"{_ms(summary.p50_ttft_ms)} / {_ms(summary.p90_ttft_ms)} / {_ms(summary.p99_ttft_ms)}",
        ),
        ("TPOT p50 (ms)", _ms(summary.p50_tpot_ms)),
        ("ITL p50 (ms)", _ms(summary.p50_itl_ms)),
        ("decode per stream (tok/s)", _ms(summary.per_stream_decode_tok_s)),
        ("E2E p50 / p99 (ms)", f"{_ms(summary.p50_e2e_ms)} / {_ms(summary.p99_e2e_ms)}"),
        ("queue p50 (ms)", _ms(summary.p50_queue_ms)),
        ("duration (s)", "-" if summary.duration is None else f"{summary.duration:,.2f}"),
        (
            "throughput: requests/s | output tok/s | total tok/s",
            f"{_rate(summary.request_throughput)} | {_ms(summary.output_throughput)} | "
            f"{_ms(summary.total_token_throughput)}",
        ),
        *_goodput_rows(summary),
        *kv_memory_rows(run.get("kv_memory")),
    ]
    if run.get("verify"):
        rows.append(("outputs differing from cache-off", str(summary.num_mismatched_outputs)))
    if logits := run.get("verify_logits"):  # the paged engine: kvbench.engine.paged.verify
        rows.extend(verify_logit_rows(logits))
    for metric, value in rows:
        table.add_row(metric, value)
    table.caption = "TTFT percentiles exclude the cold first request; token hit rate = cached / prompt tokens"
    table.caption += cached_tokens_note(summary)
    return table


def summary_title(name: str, run: dict[str, Any]) -> str:
    """``kvbench run: NAME``, then the backend and model, then what ran (the engine and its cache in
    :mod:`kvbench.results.what_ran`'s words, or the server's URL), each on a line of its own: one
    line of all three broke mid-parenthesis at 80 columns."""
    if run["backend"] in ("openai", "anthropic"):
        hygiene = f", hygiene {run['hygiene']}" if "hygiene" in run else ""
        lines = (f"{run['backend']} {run['base_url']}", f"{run['model']}{hygiene}")
    else:
        lines = (f"{run['backend']}, {run['model']}", what_ran({"run": run}).describe(detail=True))
    return "\n".join((f"kvbench run: {name}", *lines))


def _goodput_rows(summary: RunSummary) -> list[tuple[str, str]]:
    good = summary.goodput
    if good is None:
        return []
    return [
        (
            "goodput (req/s): all | cache hits | misses",
            f"{_rate(good.request_goodput)} | {_rate(good.request_goodput_cache_hit)} | "
            f"{_rate(good.request_goodput_cache_miss)}",
        ),
        (
            "met every SLO: all | cache hits | misses",
            f"{_rate(good.slo_attainment)} | {_rate(good.slo_attainment_cache_hit)} "
            f"({good.num_cache_hit_requests}) | "
            f"{_rate(good.slo_attainment_cache_miss)} ({good.num_cache_miss_requests})",
        ),
    ]


def latency_table(summary: RunSummary) -> Table:
    """vLLM's statistics, one row per metric: mean, median, std and the chosen percentiles (ms)."""
    metrics = list(dict.fromkeys(key.rsplit("_", 2)[-2] for key in summary.latency))
    table = Table(title="latency (ms; vLLM's keys, e.g. median_ttft_ms)")
    table.add_column("metric")
    stats = [key[: -len(f"_{metrics[0]}_ms")] for key in summary.latency if key.endswith(f"_{metrics[0]}_ms")]
    for stat in stats:
        table.add_column(stat, justify="right")
    for metric in metrics:
        table.add_row(metric, *(_ms(summary.latency.get(f"{stat}_{metric}_ms")) for stat in stats))
    table.caption = "ttft: without the cold first request"
    return table


def cached_tokens_note(summary: RunSummary) -> str:
    """Why the hit rate is missing or leaves requests out ("" when every request counted)."""
    notes = []
    if summary.num_cached_unreported:
        notes.append(
            f"{counted(summary.num_cached_unreported, 'request')} without cached_tokens (not 0: missing; "
            "vLLM "
            "reports it with --enable-prompt-tokens-details, SGLang with --enable-cache-report)"
        )
    if summary.num_cached_impossible:
        notes.append(
            f"[red]{summary.num_cached_impossible} requests reported impossible cached_tokens "
            "(< 0 or > prompt tokens)[/red]"
        )
    return "; " + "; ".join(notes) + ", kept out of the hit rate" if notes else ""


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


MAX_SHORT_LISTED = 5  # request ids shown for short outputs


def _flag_rows(table: Table, label: str, flagged: tuple[Flagged, ...]) -> None:
    from kvbench.backends.openai.reconcile import MAX_LISTED

    for item in flagged[:MAX_LISTED]:
        possible = "-" if item.possible_tokens is None else f"{item.possible_tokens:,}"
        table.add_row(
            f"  {label} {item.request_id}",
            f"prompt {item.prompt_tokens:,}: reported {item.reported_tokens:,}, expected "
            f"{item.expected_tokens:,}, possible {possible}",
        )
    if len(flagged) > MAX_LISTED:
        table.add_row(f"  {label} ...", f"{len(flagged) - MAX_LISTED} more (see the Parquet metadata)")


def _metrics_cell(rec: Reconciliation) -> str:
    """The hit rate from the server's /metrics delta, its counts and scope (``-`` and why, without one)."""
    metrics = f"- ({rec.metrics_scope or 'no prefix-cache counters at /metrics'})"
    if rec.metrics_partial is not None:
        return f"- ({rec.metrics_partial})"
    if rec.metrics_family is not None:
        scope = f"; {rec.metrics_scope}" if rec.metrics_scope else ""
        metrics = (
            f"{_rate(rec.metrics_hit_rate)} ({rec.metrics_hits_tokens:,.0f} / "
            f"{rec.metrics_queries_tokens:,.0f} "
            f"tokens, {rec.metrics_family.rsplit('_', 1)[0]}{scope})"
        )
    return metrics


def _check_entries(rows: list[ResultRow], rec: Reconciliation) -> list[tuple[str, str]]:
    """The (check, value) rows of the reconciliation table; a red flag's label is red when it is set."""
    return [
        ("failed requests", error_kinds(rows) or "0"),
        ("responses with several tokens in a chunk", str(num_multi_token_chunks(rows))),
        ("requests compared / without cached_tokens", f"{rec.num_compared} / {rec.num_unreported}"),
        ("hit rate reported by the server (usage)", _rate(rec.reported_hit_rate)),
        ("hit rate expected (simulator)", _rate(rec.expected_hit_rate)),
        ("hit rate from /metrics delta", _metrics_cell(rec)),
        (
            "[red]reported > possible (red flag)[/red]"
            if rec.over_possible
            else "reported > possible (red flag)",
            str(len(rec.over_possible)),
        ),
        ("reported > expected (served out of trace order)", str(rec.num_above_expected)),
        ("reported < expected by more than one block", str(len(rec.below_expected))),
        ("server prompt tokens != local count", str(rec.num_prompt_token_mismatches)),
        (
            "[red]impossible cached_tokens (< 0 or > prompt), excluded[/red]"
            if rec.impossible
            else "impossible cached_tokens (< 0 or > prompt), excluded",
            str(len(rec.impossible)),
        ),
        (
            "[red]outputs shorter than max_tokens under ignore_eos[/red]"
            if rec.short_outputs
            else "outputs shorter than max_tokens under ignore_eos",
            str(len(rec.short_outputs)),
        ),
    ]


def _short_outputs_row(table: Table, rec: Reconciliation) -> None:
    """The first :data:`MAX_SHORT_LISTED` request ids with short outputs, and how many more."""
    if rec.short_outputs:
        shown = ", ".join(rec.short_outputs[:MAX_SHORT_LISTED])
        table.add_row(
            "  short",
            shown
            + (
                f" and {len(rec.short_outputs) - MAX_SHORT_LISTED} more"
                if len(rec.short_outputs) > MAX_SHORT_LISTED
                else ""
            ),
        )


def http_tables(rows: list[ResultRow], reconciliation: Reconciliation) -> list[Table]:
    """The HTTP backend's extra section: failures by kind, stream chunking, and the reconciliation of
    reported cached tokens with the simulator's expectation and the server's /metrics."""
    rec = reconciliation
    size = "unbounded" if rec.capacity_blocks is None else f"{rec.capacity_blocks:,} blocks"
    caches = "ideal cache" if rec.fleet is None else f"{rec.fleet}, each an ideal cache"
    table = Table(
        title=f"cached tokens: reported vs expected ({caches}: {rec.block_size}-token blocks, {size})"
    )
    table.add_column("check")
    table.add_column("value", justify="right")
    for check, value in _check_entries(rows, rec):
        table.add_row(check, value)
    _flag_rows(table, "over", rec.over_possible)
    _flag_rows(table, "below", rec.below_expected)
    _flag_rows(table, "impossible", rec.impossible)
    _short_outputs_row(table, rec)
    table.caption = (
        "all successful requests, warm-up included (as /metrics counts them); hit rate = cached / "
        "prompt tokens; possible = longest shared prefix with a request sent before this one ended"
    )
    if rec.num_compared == 0 and rec.num_unreported:
        table.caption += (
            "; the server reported no cached_tokens (vLLM: --enable-prompt-tokens-details, "
            "SGLang: --enable-cache-report)"
        )
    return [table]


def replica_table(rows: Sequence[ResultRow], base_urls: Sequence[str], route: str) -> Table | None:
    """The per-replica table, or ``None`` for an unrouted run."""
    summary = replica_rows(rows)
    if not summary:
        return None
    table = Table(title=f"replicas (client-side routing: {route})")
    for column in ("replica", "base URL", "requests", "prompt tokens", "cached", "token hit"):
        table.add_column(column, justify="left" if column == "base URL" else "right")
    for entry in summary:
        url = base_urls[entry["replica"]] if entry["replica"] < len(base_urls) else "?"
        table.add_row(
            str(entry["replica"]),
            url,
            f"{entry['requests']:,}",
            f"{entry['prompt_tokens']:,}",
            f"{entry['cached_prompt_tokens']:,}",
            f"{entry['token_hit_rate']:.4f}",
        )
    return table


def replica_metrics_table(report: dict[str, Any] | None) -> Table | None:
    """``--replica-metrics``: each replica's ``/metrics`` delta and the client's rows naming it, then
    their sum, titled the fleet's only when it matches what the client saw; ``None`` without the flag."""
    if report is None:
        return None
    matched = report["verdict"] is None
    table = Table(title="replicas' own /metrics" + (" (sum = the client's traffic)" if matched else ""))
    for column in ("replica", "requests", "prompt tokens", "cached", "token hit", "client rows / prompt"):
        table.add_column(column, justify="left" if column == "replica" else "right")
    entries = report["replicas"] + ([report["fleet"]] if report["fleet"] is not None else [])
    for entry in entries:
        name = ("fleet" if matched else "sum (not the fleet's)") if entry["url"] == "fleet" else entry["url"]
        if entry["problem"] is not None:
            table.add_row(name, entry["problem"], "", "", "", "")
            continue
        client = (
            "-"
            if entry["client_requests"] is None
            else f"{entry['client_requests']:,} / {entry['client_prompt_tokens']:,}"
        )
        table.add_row(
            name,
            "-" if entry["requests"] is None else f"{entry['requests']:,.0f}",
            f"{entry['prompt_tokens']:,.0f}",
            f"{entry['cached_tokens']:,.0f}",
            _rate(entry["hit_rate"]),
            client,
        )
    return table
