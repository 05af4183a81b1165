"""``kvbench explain``: the waterfall of a trace's prompt tokens and the cause of every miss."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kvbench.bill.rules import Provider, cache_rules
from kvbench.commands import explain_tables as tables
from kvbench.commands import options as opt
from kvbench.commands.bill import DEFAULT_MODELS
from kvbench.commands.common import build, make_console
from kvbench.run.config import CacheFlags


class ExplainFormat(str, Enum):
    """``--format``: rich tables, or one JSON document (waterfall and fixes)."""

    TABLE = "table"
    JSON = "json"


def explain(
    source: Annotated[
        Path, typer.Argument(help="Scenario (.toml), trace (.jsonl) or a run's results (.parquet).")
    ],
    cache_size: Annotated[
        str | None, typer.Option(help="Capacity in blocks (default: room for everything).")
    ] = None,
    block_size: opt.BlockSize = None,
    cache_kind: opt.CacheKindOption = None,
    ttl: Annotated[
        float | None, typer.Option(help="Expire blocks idle longer than this (trace seconds).")
    ] = None,
    release: opt.Release = None,
    hash_algo: opt.HashAlgoOption = None,
    salt: Annotated[str | None, typer.Option(help="Namespace of requests without their own salt.")] = None,
    prompt_only: opt.PromptOnly = False,
    requests: opt.Requests = None,
    min_cacheable_tokens: Annotated[
        int | None, typer.Option(help="A provider's minimum cacheable prompt (OpenAI, Anthropic: 1024).")
    ] = None,
    lint: Annotated[
        bool, typer.Option("--lint", help="Check the prompt layout rules only (no replay).")
    ] = False,
    show: Annotated[
        int,
        typer.Option(
            min=0, help="Per-request rows (the requests that lost most) or --lint findings to print."
        ),
    ] = 12,
    png: Annotated[Path | None, typer.Option(help="Write the waterfall as a PNG here.")] = None,
    format: Annotated[
        ExplainFormat, typer.Option(help="table (default) or json: the waterfall and the fixes.")
    ] = ExplainFormat.TABLE,  # noqa: A002
    replicas: Annotated[
        int, typer.Option(min=1, help="Replicas for the routing fix (kvbench route's policies).")
    ] = 1,
    model_shape: Annotated[
        str, typer.Option(help="A model shape (preset or config.json) the capacity fix sizes in bytes too.")
    ] = "llama-3.1-8b",
    ttft_fit: Annotated[
        Path | None,
        typer.Option(help="Estimate TTFT from this sweep summary or run (default: a run file's own rows)."),
    ] = None,
    provider: Annotated[
        Provider, typer.Option(help="Price each fix's bill at this provider's default model.")
    ] = Provider.OPENAI,
) -> None:
    """Why the cache is not buying more: each loss between the prompt tokens and the hits, and the fixes.

    All prompt tokens -> what an ideal cache could hit -> each
    loss (block floor, last token, salt, capacity, TTL, server) -> hit; the ranked fixes, each
    replayed (hit rate, prompt tokens saved, TTFT estimate, bill); and per request the first token
    where it diverges from the best earlier request and the cause of every miss."""
    from kvbench.explain.sources import ExplainConfig, FixConfig, explain_and_fix, lint_file

    config = build(
        lambda: ExplainConfig(
            source,
            CacheFlags(
                cache_kind=cache_kind,
                block_size=block_size,
                cache_size=cache_size,
                ttl=ttl,
                release=release,
                hash_algo=hash_algo,
                prompt_only=prompt_only or None,
            ),
            salt,
            requests,
            min_cacheable_tokens,
        )
    )
    console = make_console()
    if lint:
        for table in tables.lint_tables(lint_file(config), show):
            console.print(table)
        return
    rules = cache_rules(provider, DEFAULT_MODELS[provider])
    fixed = explain_and_fix(config, build(lambda: FixConfig(model_shape, ttft_fit, rules, replicas)))
    roomy = cache_size is None and source.suffix != ".parquet"  # the default: room for everything
    if format is ExplainFormat.JSON:
        typer.echo(json.dumps(explanation_json(fixed, roomy), indent=2))
        return
    _print_tables(console, fixed, roomy, show, png)


def _print_tables(console, fixed, roomy: bool, show: int, png: Path | None) -> None:
    """The waterfall, the fix list (and where its TTFT estimates come from), the per-request rows."""
    explanation = fixed.explanation
    console.print(tables.waterfall_table(explanation, roomy))
    for note in explanation.rules.notes:
        console.print(f"note: {escape(note)}")
    console.print("[bold]what to change[/bold] (each change replayed; ranked by gain):")
    for line in tables.fix_lines(fixed.fixes):
        console.print(f"  {escape(line)}")
    if fixed.ttft_note and fixed.fixes:
        console.print(f"  {escape(fixed.ttft_note)}")
    console.print(tables.requests_table(explanation, show))
    if png is not None:
        from kvbench.explain.plot import plot_waterfall

        console.print(
            f"wrote {plot_waterfall(explanation.waterfall, png, tables.waterfall_title(explanation, roomy))}"
        )


def explanation_json(fixed, roomy: bool = False) -> dict:
    """The ``--format json`` document: title, waterfall rows, the ranked fixes and the TTFT fit used."""
    explanation = fixed.explanation
    rows = [
        {"step": label, "tokens": tokens, "share": share, "left": left}
        for label, tokens, share, left in explanation.waterfall.rows()
    ]
    return {
        "title": tables.waterfall_title(explanation, roomy),
        "waterfall": rows,
        "notes": list(explanation.rules.notes),
        "ttft_fit": fixed.ttft_note,
        "fixes": [{"rank": rank, **fix.as_dict()} for rank, fix in enumerate(fixed.fixes, start=1)],
    }


def register(app: typer.Typer) -> None:
    app.command("explain")(explain)
