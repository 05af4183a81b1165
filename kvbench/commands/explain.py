"""``kvbench explain``: the waterfall of a trace's prompt tokens and the cause of every miss."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench.words import counted
from kvbench.commands import options as opt
from kvbench.commands.common import build, make_console
from kvbench.run.config import CacheFlags


PLAIN_NEW = ("never seen", "new tokens", "new message")  # the first cause when nothing was lost to content


def explain(
    source: Annotated[Path, typer.Argument(help="Scenario (.toml), trace (.jsonl) or a run's results (.parquet).")],
    cache_size: Annotated[str | None, typer.Option(help="Capacity in blocks (default: room for everything).")] = None,
    block_size: opt.BlockSize = None,
    cache_kind: opt.CacheKindOption = None,
    ttl: Annotated[float | None, typer.Option(help="Expire blocks idle longer than this (trace seconds).")] = None,
    release: opt.Release = None,
    hash_algo: opt.HashAlgoOption = None,
    salt: Annotated[str | None, typer.Option(help="Namespace of requests without their own salt.")] = None,
    prompt_only: opt.PromptOnly = False,
    requests: opt.Requests = None,
    min_cacheable_tokens: Annotated[int | None, typer.Option(help="A provider's minimum cacheable prompt (OpenAI, Anthropic: 1024).")] = None,
    lint: Annotated[bool, typer.Option("--lint", help="Check the prompt layout rules only (no replay).")] = False,
    show: Annotated[int, typer.Option(help="Per-request rows to print (the requests that lost most).")] = 12,
    png: Annotated[Path | None, typer.Option(help="Write the waterfall as a PNG here.")] = None,
) -> None:
    """Why the cache is not buying more: all prompt tokens -> what an ideal cache could hit -> each
    loss (block floor, last token, salt, capacity, TTL, server) -> hit, and per request the first
    token where it diverges from the best earlier request and the cause of every miss."""
    from kvbench.explain.sources import ExplainConfig, explain_file, lint_file

    config = build(lambda: ExplainConfig(source, CacheFlags(cache_kind=cache_kind, block_size=block_size,
                                                            cache_size=cache_size, ttl=ttl, release=release,
                                                            hash_algo=hash_algo, prompt_only=prompt_only or None),
                                         salt, requests, min_cacheable_tokens))
    console = make_console()
    if lint:
        for table in lint_tables(lint_file(config)):
            console.print(table)
        return
    explanation = explain_file(config)
    roomy = cache_size is None and source.suffix != ".parquet"  # the default: room for everything
    console.print(waterfall_table(explanation, roomy))
    console.print(requests_table(explanation, show))
    if png is not None:
        from kvbench.explain.plot import plot_waterfall

        console.print(f"wrote {plot_waterfall(explanation.waterfall, png, waterfall_title(explanation, roomy))}")


def waterfall_title(explanation, roomy: bool = False) -> str:
    config = explanation.config
    ttl = f", TTL {config.ttl_s:g} s" if config.ttl_s else ""
    room = " (room for everything)" if roomy else ""
    return (f"kvbench explain: {explanation.name} ({counted(len(explanation.requests), 'request')}; {config.kind.value} "
            f"cache of {config.capacity_blocks:,} blocks of {config.block_size}{room}{ttl})")


def waterfall_table(explanation, roomy: bool = False) -> Table:
    table = Table(title=waterfall_title(explanation, roomy))
    for column in ("step", "tokens", "share", "left"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for label, tokens, share, left in explanation.waterfall.rows():
        table.add_row(label, f"{tokens:,}", f"{share:.2%}", f"{left:,}")
    table.caption = "share = of all prompt tokens; the losses and the hit sum to the ideal, the ideal and 'never sent before' to the total"
    return table


def requests_table(explanation, show: int) -> Table:
    """The ``show`` requests that lost most (not counting plain new content), in replay order."""
    def lost(item) -> int:  # a content cause (a timestamp, a reordered JSON) counts; plain new content does not
        plain = item.causes and item.causes[0].kind in PLAIN_NEW
        return item.request.num_tokens - item.hit_tokens - (item.bars.tokens["new"] if plain else 0)

    chosen = sorted(sorted(explanation.requests, key=lost, reverse=True)[:show], key=lambda e: e.request.arrival_s)
    table = Table(title=f"per request: the {len(chosen)} that lost most", show_lines=True)
    for column in ("request", "prompt", "hit", "diverges at", "causes (tokens, offset)"):
        table.add_column(column, justify="left" if column in ("request", "causes (tokens, offset)") else "right")
    for item in chosen:
        earlier = f"{item.shared_tokens:,} vs {item.earlier_request_id}" if item.earlier_request_id else "-"
        lines = []
        for cause in item.causes:
            at = "" if cause.offset_tokens is None else f" @{cause.offset_tokens:,}"
            lines.append(f"[bold]{cause.kind}[/bold] {cause.tokens:,}{at}: {cause.detail}")
            if cause.excerpt:
                lines.append(f"  this:    {cause.excerpt}")
                lines.append(f"  earlier: {cause.earlier_excerpt}")
        table.add_row(item.request.request_id, f"{item.request.num_tokens:,}", f"{item.hit_tokens:,}", earlier,
                      "\n".join(lines).replace("[", "\\[").replace("\\[bold]", "[bold]").replace("\\[/bold]", "[/bold]"))
    return table


def lint_tables(report) -> list[Table]:
    summary = Table(title="kvbench explain --lint")
    summary.add_column("check")
    summary.add_column("result", justify="right")
    summary.add_row("prompt tokens after the first volatile value",
                    f"{report.num_tokens_after_volatile:,} of {report.num_prompt_tokens:,} ({report.share_after_volatile:.1%})")
    summary.add_row("later turns that resend the previous prompt whole",
                    f"{report.num_turns_append_only:,} of {report.num_turns_checked:,}")
    summary.add_row("findings", f"{len(report.findings):,}")
    findings = Table(title="findings", show_lines=True)
    for column in ("rule", "request", "offset", "detail"):
        findings.add_column(column, justify="right" if column == "offset" else "left")
    for finding in report.findings[:50]:
        findings.add_row(finding.rule, finding.request_id, f"{finding.offset_tokens:,}",
                         f"{finding.detail}\n{finding.excerpt}".replace("[", "\\["))
    return [summary, findings]


def register(app: typer.Typer) -> None:
    app.command("explain")(explain)
