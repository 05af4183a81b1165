"""The tables of ``kvbench explain``: the waterfall, the fix list, the per-request rows, ``--lint``."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

PLAIN_NEW = ("never seen", "new tokens", "new message")  # the first cause when nothing was lost to content


def waterfall_title(explanation, roomy: bool = False) -> str:
    config = explanation.config
    ttl = f", TTL {config.ttl_s:g} s" if config.ttl_s else ""
    room = " (room for everything)" if roomy else ""
    return (f"kvbench explain: {explanation.name} ({len(explanation.requests):,} requests; {config.kind.value} "
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


def fix_lines(fixes) -> list[str]:
    """The ranked fix list, one line per fix (``1. raise the cache to ...: +97.2 points ...``)."""
    if not fixes:
        return ["no fix: nothing the waterfall shows is lost to a setting or the prompt layout"]
    return [fix.line(rank) for rank, fix in enumerate(fixes, start=1)]
