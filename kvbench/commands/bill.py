"""``kvbench bill``: what a trace would cost at an API provider with and without prompt caching."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench.bill.api import bill_requests, bill_results
from kvbench.bill.invoice import Bill, break_even_reads
from kvbench.bill.placement import Placement
from kvbench.bill.rules import Provider, cache_rules, with_prices
from kvbench.commands.common import build, make_console
from kvbench.commands.options import Requests
from kvbench.commands.signature import option
from kvbench.errors import InputError
from kvbench.results.parquet import check_output_path, write_rows
from kvbench.run.source import limit_requests, load_source
from kvbench.workloads.tokenizer import load_tokenizer

DEFAULT_MODELS = {Provider.ANTHROPIC: "claude-sonnet-4-5", Provider.OPENAI: "gpt-5"}
Price = Annotated[float | None, typer.Option(help="Override: USD per million tokens.")]


def _table(source: str, bill: Bill) -> Table:
    r = bill.rules
    table = Table(
        title=f"kvbench bill: {source} on {r.provider.value} {r.model} "
        f"({bill.num_requests:,} requests, retention {r.retention}, TTL {r.ttl_s:,.0f} s)"
    )
    for column in ("line", "tokens", "USD / MTok", "USD"):
        table.add_column(column, justify="left" if column == "line" else "right")
    tokens = {
        "input": bill.input_tokens,
        "cache writes": bill.cache_write_tokens,
        "cache reads": bill.cache_read_tokens,
        "output": bill.output_tokens,
    }
    prices = {
        "input": r.prices.input_per_mtok,
        "cache writes": r.prices.cache_write_per_mtok,
        "cache reads": r.prices.cache_read_per_mtok,
        "output": r.prices.output_per_mtok,
    }
    for line, cost in bill.lines().items():
        table.add_row(line, f"{tokens[line]:,}", f"{prices[line]:.4g}", f"{cost:,.4f}")
    table.add_row(
        "total (with caching)", f"{bill.prompt_tokens + bill.output_tokens:,}", "", f"{bill.total_usd:,.4f}"
    )
    table.add_row("without caching", "", "", f"{bill.no_cache_usd:,.4f}")
    share = bill.saving_usd / bill.no_cache_usd if bill.no_cache_usd else 0.0
    table.add_row("saving", "", "", f"{bill.saving_usd:,.4f} ({share:.1%})")
    reads = break_even_reads(r.write_multiplier, r.read_multiplier)
    table.caption = (
        f"{bill.num_writes:,} requests wrote to the cache, {bill.num_reads:,} read from it; "
        f"break-even: a write pays off after {reads} read(s) within the TTL "
        f"(write {r.write_multiplier:.2f}x, read {r.read_multiplier:.2f}x input); "
        f"prices as of {r.as_of}{'' if r.verified else ' (transcribed, not re-read: check)'}: {r.source}"
    )
    return table


def bill(
    source: Annotated[
        Path,
        typer.Argument(
            help="Scenario (.toml), trace (.jsonl), or a kvbench run results "
            "file (.parquet: priced from its recorded usage)."
        ),
    ],
    provider: option(Provider, "Whose caching rules and prices.") = Provider.ANTHROPIC,
    model: option(
        str | None,
        "Model as the provider names it (default: claude-sonnet-4-5 "
        "or gpt-5); prices from kvbench/bill/providers.toml.",
    ) = None,
    retention: option(str | None, "Anthropic 5m (default) or 1h; OpenAI in-memory (default) or 24h.") = None,
    placement: option(
        Placement | None,
        "Anthropic breakpoints: messages (after the system "
        "prompt and the last stable turn; default for chat), "
        "system, or end (default for token ids).",
    ) = None,
    input_price: Price = None,
    output_price: Price = None,
    cache_write_price: Price = None,
    cache_read_price: Price = None,
    requests: Requests = None,
    out: option(Path | None, "Also write the bill as a one-row Parquet file.") = None,
) -> None:
    """Price a trace under a provider's prompt caching (its cache simulated on the trace's timestamps):
    input, cache writes, cache reads, output, the total with and without caching, and the break-even."""
    if requests is not None and requests <= 0:
        raise InputError(f"--requests: {requests} is not a positive number of requests")
    if out is not None:
        check_output_path(out)
    rules = cache_rules(provider, model or DEFAULT_MODELS[provider], retention)
    rules = build(
        lambda: with_prices(
            rules,
            input_per_mtok=input_price,
            output_per_mtok=output_price,
            cache_write_per_mtok=cache_write_price,
            cache_read_per_mtok=cache_read_price,
        )
    )
    if source.suffix == ".parquet":  # a measured run: its recorded usage
        result, name, description = bill_results(source, rules), source.stem, {"results": str(source)}
    else:
        loaded = load_source(source, limit=requests)
        tokenizer = load_tokenizer(loaded.trace.header.tokenizer) if loaded.trace is not None else None
        result = bill_requests(
            limit_requests(loaded.requests, requests), rules, placement, tokenizer, loaded.block_size
        )
        name, description = loaded.name, loaded.description
    console = make_console()
    console.print(_table(name, result))
    if out is not None:
        write_rows(out, [result.as_row()], {"command": "bill", "source": description})
        console.print(f"wrote {out}")


def register(app: typer.Typer) -> None:
    app.command("bill")(bill)
