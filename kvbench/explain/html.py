"""The explain view of ``kvbench report --explain``: per run file, the waterfall (PNG and table) and
the per-request table with the divergence excerpts, as the report's own table and figure types."""

from __future__ import annotations

from pathlib import Path

from kvbench.bill.rules import CacheRules
from kvbench.explain.api import Explanation
from kvbench.explain.fixes import Fix
from kvbench.explain.plot import plot_waterfall
from kvbench.explain.sources import ExplainConfig, FixConfig, explain_and_fix
from kvbench.results.report import Figure, TableData

MAX_REQUEST_ROWS = 40  # the requests that lost most


def explain_section(
    path: Path, out_dir: Path, rules: CacheRules | None = None
) -> tuple[list[TableData], list[Figure]]:
    """Explain one run's Parquet file (:func:`kvbench.explain.sources.explain_and_fix`, its fixes
    priced with ``rules``) for the report.

    Raises:
        InputError: the file is not a run's results, or its source file cannot be read.
    """
    fixed = explain_and_fix(ExplainConfig(Path(path)), FixConfig(rules=rules))
    explanation, fixes = fixed.explanation, fixed.fixes
    title = f"explain: {explanation.name}"
    png = plot_waterfall(explanation.waterfall, Path(out_dir) / f"explain-{explanation.name}.png", title)
    caption = (
        "where the prompt tokens went: an ideal cache's hit, then each loss, down to what the server "
        "reported; the bars sum exactly"
    )
    tables = [
        waterfall_table(explanation, title),
        fixes_table(fixes, title, fixed.ttft_note),
        requests_table(explanation),
    ]
    return tables, [Figure(png, caption)]


def fixes_table(fixes: list[Fix], title: str, ttft_note: str | None = None) -> TableData:
    """The ranked fixes: the change, its gain and hit rates, prompt tokens saved, TTFT and bill."""

    def money(value: float | None) -> str:
        return "-" if value is None else f"${value:,.4f}"

    rows = tuple(
        (
            str(rank),
            fix.change,
            f"{fix.gain_points:+.1f}",
            f"{fix.hit_rate_before:.1%}",
            f"{fix.hit_rate_after:.1%}",
            f"{fix.num_saved_tokens:,}",
            "-" if fix.ttft_p50_change_ms is None else f"~{fix.ttft_p50_change_ms:+,.0f}",
            f"{money(fix.bill_before_usd)} -> {money(fix.bill_after_usd)}",
            fix.cost,
        )
        for rank, fix in enumerate(fixes, start=1)
    )
    return TableData(
        f"{title}: what to change",
        (
            "rank",
            "change",
            "points",
            "hit before",
            "hit after",
            "prompt tokens saved",
            "TTFT p50 ms (estimate)",
            "bill",
            "cost",
        ),
        rows,
        "each change replayed through the run's cache; " + (ttft_note or "no TTFT fit"),
        text_columns=(1, 8),
    )


def waterfall_table(explanation: Explanation, title: str) -> TableData:
    rows = tuple(
        (label, f"{tokens:,}", f"{share:.2%}", f"{left:,}")
        for label, tokens, share, left in explanation.waterfall.rows()
    )
    return TableData(
        f"{title}: waterfall", ("step", "tokens", "share", "left"), rows, "share = of all prompt tokens"
    )


def requests_table(explanation: Explanation) -> TableData:
    """The requests that lost most beyond their own new tokens (the rest: one count in the caption)."""
    losing = [item for item in explanation.requests if item.num_lost_tokens > 0]
    chosen = sorted(
        sorted(losing, key=lambda e: e.num_lost_tokens, reverse=True)[:MAX_REQUEST_ROWS],
        key=lambda item: item.request.arrival_s,
    )
    rows = []
    for item in chosen:
        causes = []
        for cause in item.causes:
            at = "" if cause.offset_tokens is None else f" @{cause.offset_tokens:,}"
            text = f"{cause.kind} {cause.tokens:,}{at}: {cause.detail}"
            if cause.excerpt:
                text += f" | this: {cause.excerpt} | earlier: {cause.earlier_excerpt}"
            causes.append(text)
        earlier = f"{item.shared_tokens:,} vs {item.earlier_request_id}" if item.earlier_request_id else "-"
        rows.append(
            (
                item.request.request_id,
                f"{item.request.num_tokens:,}",
                f"{item.hit_tokens:,}",
                earlier,
                " || ".join(causes).replace("⏎", "↵"),
            )
        )
    only_new = len(explanation.requests) - len(losing)
    caption = f"{only_new:,} requests lost only their own new tokens (not listed)" if only_new else ""
    return TableData(
        f"explain: {explanation.name}: per request (the {len(rows)} that lost most)",
        ("request", "prompt", "hit", "diverges at", "causes (tokens, offset; ‖ marks the offset)"),
        tuple(rows),
        caption,
        text_columns=(4,),
        folded=True,  # one row per request: the page folds it under its title, after the plots
    )
