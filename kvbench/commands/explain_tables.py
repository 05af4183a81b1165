"""The tables of ``kvbench explain``: the waterfall, the fix list, the per-request rows, ``--lint``."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kvbench.words import counted


def _title_parts(explanation, roomy: bool) -> tuple[str, str, str]:
    """``kvbench explain: NAME``, ``N requests`` and the cache replayed (``copy engine: hash cache of
    5 blocks of 16 (room for everything), TTL 300 s``)."""
    config = explanation.config
    ttl = f", TTL {config.ttl_s:g} s" if config.ttl_s else ""
    room = " (room for everything)" if roomy else ""
    count = counted(len(explanation.requests), "request")
    return f"kvbench explain: {explanation.name}", count, f"{explanation.rules.describe(config)}{room}{ttl}"


def waterfall_title(explanation, roomy: bool = False) -> str:
    """The title on one line, as the PNG and ``--format json`` carry it."""
    head, count, cache = _title_parts(explanation, roomy)
    return f"{head} ({count}; {cache})"


def waterfall_table(explanation, roomy: bool = False) -> Table:
    """The waterfall, titled on two lines (the run and its request count, then the cache replayed):
    one line of both broke mid-parenthesis at 80 columns."""
    head, count, cache = _title_parts(explanation, roomy)
    table = Table(title=escape(f"{head} ({count})\n{cache}"))
    for column in ("step", "tokens", "share", "left"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for label, tokens, share, left in explanation.waterfall.rows():
        table.add_row(label, f"{tokens:,}", f"{share:.2%}", f"{left:,}")
    table.caption = (
        "share = of all prompt tokens; the losses and the hit sum to the ideal, the ideal and "
        "'never sent before' to the total"
    )
    return table


def requests_table(explanation, show: int) -> Table:
    """The ``show`` requests that lost most beyond their own new tokens, in replay order; the
    requests whose only loss is their own new tokens are one count in the caption."""
    losing = [item for item in explanation.requests if item.num_lost_tokens > 0]
    chosen = sorted(
        sorted(losing, key=lambda e: e.num_lost_tokens, reverse=True)[:show],
        key=lambda e: e.request.arrival_s,
    )
    table = Table(title=f"per request: the {len(chosen)} that lost most", show_lines=True)
    for column in ("request", "prompt", "hit", "diverges at", "causes (tokens, offset)"):
        table.add_column(
            column, justify="left" if column in ("request", "causes (tokens, offset)") else "right"
        )
    for item in chosen:
        earlier = f"{item.shared_tokens:,} vs {item.earlier_request_id}" if item.earlier_request_id else "-"
        table.add_row(
            escape(item.request.request_id),
            f"{item.request.num_tokens:,}",
            f"{item.hit_tokens:,}",
            escape(earlier),
            "\n".join(_cause_lines(item)),
        )
    table.caption = requests_caption(len(explanation.requests) - len(losing), len(losing) - len(chosen))
    return table


def requests_caption(num_only_new: int, num_omitted: int) -> str:
    """``N requests lost only their own new tokens (not listed); M more omitted (--show)``."""
    parts = []
    if num_only_new:
        parts.append(f"{num_only_new:,} requests lost only their own new tokens (not listed)")
    if num_omitted:
        parts.append(f"{num_omitted:,} more omitted (--show N lists more)")
    return "; ".join(parts)


def _cause_lines(item) -> list[str]:
    lines = []
    for cause in item.causes:
        at = "" if cause.offset_tokens is None else f" @{cause.offset_tokens:,}"
        lines.append(f"[bold]{escape(cause.kind)}[/bold] {cause.tokens:,}{at}: {escape(cause.detail)}")
        if cause.excerpt:
            lines.append(f"  this:    {escape(cause.excerpt)}")
            lines.append(f"  earlier: {escape(cause.earlier_excerpt)}")
    return lines


def lint_tables(report, show: int = 12) -> list[Table]:
    """The checks, the first ``show`` findings (then ``N more omitted``), and a summary per finding kind."""
    summary = Table(title="kvbench explain --lint")
    summary.add_column("check")
    summary.add_column("result", justify="right")
    summary.add_row(
        "prompt tokens after the first volatile value",
        f"{report.num_tokens_after_volatile:,} of {report.num_prompt_tokens:,} "
        f"({report.share_after_volatile:.1%})",
    )
    summary.add_row(
        "later turns that resend the previous prompt whole",
        f"{report.num_turns_append_only:,} of {report.num_turns_checked:,}",
    )
    summary.add_row("findings", f"{len(report.findings):,}")
    findings = Table(title=f"findings (the first {min(show, len(report.findings)):,})", show_lines=True)
    for column in ("rule", "request", "offset", "detail"):
        findings.add_column(column, justify="right" if column == "offset" else "left")
    for finding in report.findings[:show]:
        findings.add_row(
            finding.rule,
            escape(finding.request_id),
            f"{finding.offset_tokens:,}",
            escape(f"{finding.detail}\n{finding.excerpt}"),
        )
    omitted = len(report.findings) - min(show, len(report.findings))
    if omitted:
        findings.caption = f"{omitted:,} more omitted (--show N lists more)"
    kinds = Table(title="findings per kind")
    for column in ("rule", "kind", "findings", "first request"):
        kinds.add_column(column, justify="right" if column == "findings" else "left")
    for rule, kind, count, first in report.by_kind():
        kinds.add_row(rule, kind, f"{count:,}", escape(first))
    return [summary, findings, kinds]


def fix_lines(fixes) -> list[str]:
    """The ranked fix list, one line per fix (``1. raise the cache to ...: +97.2 points ...``)."""
    if not fixes:
        return ["no fix: nothing the waterfall shows is lost to a setting or the prompt layout"]
    return [fix.line(rank) for rank, fix in enumerate(fixes, start=1)]
